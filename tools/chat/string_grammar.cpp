// string_grammar.cpp — see string_grammar.h. Each expression is parsed into a tree, built
// into an NFA (Thompson), determinized over code-point ranges; the DFAs and a length counter
// run as one product automaton, pruned to the states from which the end can still be reached
// (a grammar never leads the model into a dead end), and written as one right-linear GBNF
// rule per state.
#include "string_grammar.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

namespace moestream::chat {
namespace {

using Range = std::pair<uint32_t, uint32_t>;  // inclusive code-point range
using CharSet = std::vector<Range>;           // sorted, disjoint, not adjacent

CharSet normalized(CharSet s) {
    std::sort(s.begin(), s.end());
    CharSet out;
    for (const Range & r : s) {
        if (!out.empty() && r.first <= out.back().second + 1)
            out.back().second = std::max(out.back().second, r.second);
        else
            out.push_back(r);
    }
    return out;
}

// Every character a JSON string value can hold in UTF-8 (no surrogates).
const CharSet kUniverse = {{0, 0xD7FF}, {0xE000, 0x10FFFF}};

CharSet intersect(const CharSet & a, const CharSet & b) {
    CharSet out;
    for (const Range & x : a)
        for (const Range & y : b) {
            const uint32_t lo = std::max(x.first, y.first), hi = std::min(x.second, y.second);
            if (lo <= hi) out.emplace_back(lo, hi);
        }
    return normalized(out);
}

CharSet complement(const CharSet & s) {
    CharSet out;
    uint32_t next = 0;
    for (const Range & r : s) {
        if (r.first > next) out.emplace_back(next, r.first - 1);
        next = r.second + 1;
    }
    if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
    return intersect(out, kUniverse);
}

const CharSet kDigit = {{'0', '9'}};
const CharSet kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CharSet kSpace = normalized({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                   {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                   {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});

struct Node {
    enum Kind { kSet, kCat, kAlt, kRep } kind = kCat;
    CharSet set;
    std::vector<Node> kids;
    int min = 0, max = 0;  // kRep; max < 0: unbounded
};

Node set_node(CharSet s) {
    Node n;
    n.kind = Node::kSet;
    n.set = normalized(std::move(s));
    return n;
}
Node rep_node(Node body, int min, int max) {
    Node n;
    n.kind = Node::kRep;
    n.min = min;
    n.max = max;
    n.kids.push_back(std::move(body));
    return n;
}

constexpr int kMaxRepeat = 1000;

// An ECMAScript regular expression in the subset of string_grammar.h.
class Parser {
public:
    explicit Parser(const std::string & utf8) {
        for (size_t i = 0; i < utf8.size();) {
            const unsigned char c = static_cast<unsigned char>(utf8[i]);
            const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
            for (int k = 1; k < n && i + size_t(k) < utf8.size(); ++k)
                cp = (cp << 6) | (static_cast<unsigned char>(utf8[i + size_t(k)]) & 0x3F);
            s_.push_back(cp);
            i += size_t(n);
        }
    }

    // The tree of the whole expression with search semantics made explicit.
    bool parse(Node * out, std::string * why) {
        Node alt;
        alt.kind = Node::kAlt;
        do {
            bool start = false, end = false;
            if (peek('^')) {
                start = true;
                ++i_;
            }
            Node seq;
            if (!parse_seq(&seq, true, &end)) return fail_to(why);
            Node whole;
            if (!start) whole.kids.push_back(rep_node(set_node(kUniverse), 0, -1));
            whole.kids.push_back(std::move(seq));
            if (!end) whole.kids.push_back(rep_node(set_node(kUniverse), 0, -1));
            alt.kids.push_back(std::move(whole));
        } while (eat('|'));
        if (i_ < s_.size()) {
            err_ = "unbalanced ')'";
            return fail_to(why);
        }
        *out = std::move(alt);
        return true;
    }

private:
    std::vector<uint32_t> s_;
    size_t i_ = 0;
    std::string err_;

    bool fail_to(std::string * why) {
        *why = err_;
        return false;
    }
    bool fail(const std::string & m) {
        if (err_.empty()) err_ = m;
        return false;
    }
    bool peek(uint32_t c) const { return i_ < s_.size() && s_[i_] == c; }
    bool eat(uint32_t c) {
        if (!peek(c)) return false;
        ++i_;
        return true;
    }

    bool parse_alt(Node * out) {
        Node alt;
        alt.kind = Node::kAlt;
        do {
            Node seq;
            if (!parse_seq(&seq, false, nullptr)) return false;
            alt.kids.push_back(std::move(seq));
        } while (eat('|'));
        *out = std::move(alt);
        return true;
    }

    // A concatenation up to '|', ')' or the end. `top`: a '$' right before '|' or the end
    // anchors the alternative (*end set).
    bool parse_seq(Node * out, bool top, bool * end) {
        out->kind = Node::kCat;
        while (i_ < s_.size() && !peek('|') && !peek(')')) {
            if (peek('$')) {
                if (top && (i_ + 1 == s_.size() || s_[i_ + 1] == '|')) {
                    ++i_;
                    *end = true;
                    return true;
                }
                return fail("'$' is supported only at the end of the expression or of a top-level alternative");
            }
            if (peek('^'))
                return fail("'^' is supported only at the start of the expression or of a top-level alternative");
            Node atom;
            if (!parse_atom(&atom)) return false;
            if (!parse_quantifier(&atom)) return false;
            out->kids.push_back(std::move(atom));
        }
        return true;
    }

    bool number(int * v) {
        if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') return false;
        long n = 0;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            n = std::min<long>(n * 10 + long(s_[i_] - '0'), 1L << 30);
            ++i_;
        }
        *v = int(n);
        return true;
    }

    bool parse_quantifier(Node * atom) {
        int min = -1, max = -1;
        const size_t at = i_;
        if (eat('*')) {
            min = 0;
        } else if (eat('+')) {
            min = 1;
        } else if (eat('?')) {
            min = 0;
            max = 1;
        } else if (eat('{')) {
            int a = 0, b = -1;
            bool ok = number(&a);
            if (ok && eat(',')) {
                if (!peek('}')) ok = number(&b);
            } else {
                b = a;
            }
            if (!ok || !eat('}')) {
                i_ = at;  // not a quantifier: '{' is a literal (parse_atom takes it)
                return true;
            }
            if (b >= 0 && b < a) return fail("a quantifier {n,m} with m < n");
            if (a > kMaxRepeat || b > kMaxRepeat)
                return fail("a repetition count above " + std::to_string(kMaxRepeat));
            min = a;
            max = b;
        } else {
            return true;
        }
        eat('?');  // lazy: the same strings match
        if (peek('*') || peek('+') || peek('?')) return fail("a quantifier follows a quantifier");
        *atom = rep_node(std::move(*atom), min, max);
        return true;
    }

    bool hex(int digits, uint32_t * cp) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
            if (i_ >= s_.size()) return false;
            const uint32_t c = s_[i_];
            int d = c >= '0' && c <= '9' ? int(c - '0')
                    : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
                    : c >= 'A' && c <= 'F' ? int(c - 'A' + 10)
                                           : -1;
            if (d < 0) return false;
            v = v * 16 + uint32_t(d);
            ++i_;
        }
        *cp = v;
        return true;
    }

    // After a backslash: a class escape (*set) or one character (*set of one).
    bool parse_escape(CharSet * set, bool in_class) {
        if (i_ >= s_.size()) return fail("a trailing backslash");
        const uint32_t c = s_[i_++];
        switch (c) {
            case 'd': *set = kDigit; return true;
            case 'D': *set = complement(kDigit); return true;
            case 'w': *set = kWord; return true;
            case 'W': *set = complement(kWord); return true;
            case 's': *set = kSpace; return true;
            case 'S': *set = complement(kSpace); return true;
            case 't': *set = {{'\t', '\t'}}; return true;
            case 'n': *set = {{'\n', '\n'}}; return true;
            case 'r': *set = {{'\r', '\r'}}; return true;
            case 'f': *set = {{'\f', '\f'}}; return true;
            case 'v': *set = {{'\v', '\v'}}; return true;
            case '0': *set = {{0, 0}}; return true;
            case 'b':
                if (in_class) {
                    *set = {{'\b', '\b'}};
                    return true;
                }
                return fail("'\\b' (a word boundary)");
            case 'B': return fail("'\\B' (a word boundary)");
            case 'p':
            case 'P': return fail("'\\" + std::string(1, char(c)) + "{...}' (Unicode properties)");
            case 'k': return fail("'\\k' (a named back-reference)");
            case 'c': return fail("'\\c' (control-letter escapes)");
            case 'x':
            case 'u': {
                uint32_t cp = 0;
                if (!hex(c == 'x' ? 2 : 4, &cp)) return fail("a malformed '\\" + std::string(1, char(c)) + "' escape");
                if (cp >= 0xD800 && cp <= 0xDFFF) return fail("a '\\u' escape of a UTF-16 surrogate");
                *set = {{cp, cp}};
                return true;
            }
            default:
                if (c >= '1' && c <= '9') return fail("a back-reference '\\" + std::string(1, char(c)) + "'");
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                    return fail("the unknown escape '\\" + std::string(1, char(c)) + "'");
                *set = {{c, c}};
                return true;
        }
    }

    bool parse_class(CharSet * out) {
        const bool negate = eat('^');
        CharSet set;
        while (true) {
            if (i_ >= s_.size()) return fail("an unclosed '['");
            if (eat(']')) break;
            CharSet lo_set;
            uint32_t lo = 0;
            bool single = true;
            if (eat('\\')) {
                if (!parse_escape(&lo_set, true)) return false;
                single = lo_set.size() == 1 && lo_set[0].first == lo_set[0].second;
                lo = lo_set[0].first;
            } else {
                lo = s_[i_++];
                lo_set = {{lo, lo}};
            }
            if (single && peek('-') && i_ + 1 < s_.size() && s_[i_ + 1] != ']') {
                ++i_;
                uint32_t hi = 0;
                if (eat('\\')) {
                    CharSet hs;
                    if (!parse_escape(&hs, true)) return false;
                    if (!(hs.size() == 1 && hs[0].first == hs[0].second))
                        return fail("a class escape as the end of a range");
                    hi = hs[0].first;
                } else {
                    hi = s_[i_++];
                }
                if (hi < lo) return fail("a range out of order in a class");
                set.emplace_back(lo, hi);
            } else {
                set.insert(set.end(), lo_set.begin(), lo_set.end());
            }
        }
        set = intersect(normalized(set), kUniverse);
        *out = negate ? complement(set) : set;
        return true;
    }

    bool parse_atom(Node * out) {
        const uint32_t c = s_[i_];
        if (c == '*' || c == '+' || c == '?') return fail("nothing to repeat before '" + std::string(1, char(c)) + "'");
        ++i_;
        if (c == '(') {
            if (eat('?')) {
                if (eat(':')) {
                } else if (peek('<') && i_ + 1 < s_.size() && s_[i_ + 1] != '=' && s_[i_ + 1] != '!') {
                    while (i_ < s_.size() && !peek('>')) ++i_;
                    if (!eat('>')) return fail("an unclosed group name");
                } else {
                    return fail("a look-around or '(?' group");
                }
            }
            if (!parse_alt(out)) return false;
            if (!eat(')')) return fail("an unclosed '('");
            return true;
        }
        if (c == '[') {
            CharSet set;
            if (!parse_class(&set)) return false;
            *out = set_node(set);
            return true;
        }
        if (c == '.') {
            *out = set_node(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
            return true;
        }
        if (c == '\\') {
            CharSet set;
            if (!parse_escape(&set, false)) return false;
            *out = set_node(set);
            return true;
        }
        *out = set_node({{c, c}});
        return true;
    }
};

// ---- automata ----

constexpr int kMaxNfaStates = 200000;

struct Nfa {
    struct State {
        std::vector<std::pair<CharSet, int>> tr;
        std::vector<int> eps;
    };
    std::vector<State> st;
    int start = 0, accept = 0;
    bool too_big = false;

    int add() {
        if (int(st.size()) >= kMaxNfaStates) too_big = true;
        st.emplace_back();
        return int(st.size()) - 1;
    }
    // (start, end) of a fragment for n.
    std::pair<int, int> build(const Node & n) {
        if (too_big) return {0, 0};
        const int s = add();
        switch (n.kind) {
            case Node::kSet: {
                const int e = add();
                if (!n.set.empty()) st[size_t(s)].tr.emplace_back(n.set, e);
                return {s, e};
            }
            case Node::kCat: {
                int cur = s;
                for (const Node & k : n.kids) {
                    auto [ks, ke] = build(k);
                    if (too_big) return {0, 0};
                    st[size_t(cur)].eps.push_back(ks);
                    cur = ke;
                }
                return {s, cur};
            }
            case Node::kAlt: {
                const int e = add();
                for (const Node & k : n.kids) {
                    auto [ks, ke] = build(k);
                    if (too_big) return {0, 0};
                    st[size_t(s)].eps.push_back(ks);
                    st[size_t(ke)].eps.push_back(e);
                }
                return {s, e};
            }
            case Node::kRep: {
                int cur = s;
                for (int k = 0; k < n.min; ++k) {
                    auto [ks, ke] = build(n.kids[0]);
                    if (too_big) return {0, 0};
                    st[size_t(cur)].eps.push_back(ks);
                    cur = ke;
                }
                if (n.max < 0) {
                    auto [ks, ke] = build(n.kids[0]);
                    if (too_big) return {0, 0};
                    st[size_t(cur)].eps.push_back(ks);
                    st[size_t(ke)].eps.push_back(cur);
                    return {s, cur};
                }
                const int e = add();
                for (int k = n.min; k < n.max; ++k) {
                    auto [ks, ke] = build(n.kids[0]);
                    if (too_big) return {0, 0};
                    st[size_t(cur)].eps.push_back(ks);
                    st[size_t(cur)].eps.push_back(e);
                    cur = ke;
                }
                st[size_t(cur)].eps.push_back(e);
                return {s, e};
            }
        }
        return {s, s};
    }
};

struct Dfa {
    struct State {
        std::vector<std::pair<CharSet, int>> tr;  // disjoint sets
        bool accept = false;
    };
    std::vector<State> st;  // state 0 is the start
};

// Cuts the union of the sets into pieces on which each set is all-or-nothing.
std::vector<Range> pieces(const std::vector<const CharSet *> & sets) {
    std::vector<uint32_t> cuts;
    for (const CharSet * s : sets)
        for (const Range & r : *s) {
            cuts.push_back(r.first);
            cuts.push_back(r.second + 1);
        }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<Range> out;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) out.emplace_back(cuts[i], cuts[i + 1] - 1);
    return out;
}

bool contains(const CharSet & s, uint32_t c) {
    auto it = std::upper_bound(s.begin(), s.end(), Range{c, 0xFFFFFFFF});
    return it != s.begin() && std::prev(it)->second >= c;
}

bool determinize(const Nfa & n, Dfa * d, std::string * why) {
    auto closure = [&](std::vector<int> set) {
        std::vector<int> stack = set;
        std::set<int> seen(set.begin(), set.end());
        while (!stack.empty()) {
            const int s = stack.back();
            stack.pop_back();
            for (int e : n.st[size_t(s)].eps)
                if (seen.insert(e).second) stack.push_back(e);
        }
        return std::vector<int>(seen.begin(), seen.end());
    };
    std::map<std::vector<int>, int> index;
    std::vector<std::vector<int>> sets;
    auto intern = [&](std::vector<int> s) {
        auto [it, fresh] = index.emplace(s, int(sets.size()));
        if (fresh) {
            sets.push_back(std::move(s));
            d->st.emplace_back();
        }
        return it->second;
    };
    intern(closure({n.start}));
    for (size_t q = 0; q < sets.size(); ++q) {
        if (int(sets.size()) > kMaxStringStates) {
            *why = "its automaton needs more than " + std::to_string(kMaxStringStates) + " states";
            return false;
        }
        const std::vector<int> cur = sets[q];
        std::vector<const CharSet *> all;
        for (int s : cur) {
            if (s == n.accept) d->st[q].accept = true;
            for (const auto & [cs, t] : n.st[size_t(s)].tr) all.push_back(&cs);
        }
        std::map<int, CharSet> by_target;
        for (const Range & p : pieces(all)) {
            std::vector<int> next;
            for (int s : cur)
                for (const auto & [cs, t] : n.st[size_t(s)].tr)
                    if (contains(cs, p.first)) next.push_back(t);
            if (next.empty()) continue;
            const int target = intern(closure(next));
            by_target[target].push_back(p);
        }
        for (auto & [t, cs] : by_target) d->st[q].tr.emplace_back(normalized(cs), t);
    }
    return true;
}

// The JSON-string spelling of one character set: a GBNF term.
std::string gbnf_class_char(uint32_t c) {
    static const char * hexd = "0123456789ABCDEF";
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return std::string(1, char(c));
    std::string out = c < 0x100 ? "\\x" : c < 0x10000 ? "\\u" : "\\U";
    const int digits = c < 0x100 ? 2 : c < 0x10000 ? 4 : 8;
    for (int k = digits - 1; k >= 0; --k) out += hexd[(c >> (4 * k)) & 15];
    return out;
}

std::string json_term(const CharSet & s) {
    // Written as they are: everything but '"', '\' and the control characters.
    const CharSet plain = intersect(s, complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    std::vector<std::string> parts;
    if (!plain.empty()) {
        std::string c = "[";
        for (const Range & r : plain) {
            c += gbnf_class_char(r.first);
            if (r.second != r.first) c += "-" + gbnf_class_char(r.second);
        }
        parts.push_back(c + "]");
    }
    static const char * hexd = "0123456789ABCDEF";
    const bool all_controls = intersect(s, {{0, 0x1F}}) == CharSet{{0, 0x1F}};
    if (all_controls) parts.push_back("\"\\\\u00\" [01] [0-9A-F]");  // each as \u00XX
    for (const Range & r : intersect(s, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})) {
        for (uint32_t c = r.first; c <= r.second; ++c) {
            if (all_controls && c < 0x20) continue;
            std::string esc;
            switch (c) {
                case '"': esc = "\\\\\\\""; break;  // GBNF "\\\"" : the two characters \"
                case '\\': esc = "\\\\\\\\"; break;
                case '\n': esc = "\\\\n"; break;
                case '\t': esc = "\\\\t"; break;
                case '\r': esc = "\\\\r"; break;
                case '\b': esc = "\\\\b"; break;
                case '\f': esc = "\\\\f"; break;
                default:
                    esc = std::string("\\\\u00") + hexd[c >> 4] + hexd[c & 15];
            }
            parts.push_back("\"" + esc + "\"");
        }
    }
    if (parts.size() == 1) return parts[0];
    std::string out = "(";
    for (size_t k = 0; k < parts.size(); ++k) out += (k ? " | " : " ") + parts[k];
    return out + " )";
}

}  // namespace

bool string_grammar(const std::vector<std::string> & regexes, int min_len, int max_len,
                    const std::string & prefix,
                    std::vector<std::pair<std::string, std::string>> * rules, std::string * expr,
                    std::string * why) {
    std::vector<Dfa> dfas;
    for (const std::string & re : regexes) {
        Node tree;
        Parser p(re);
        std::string e;
        if (!p.parse(&tree, &e)) {
            *why = "'" + re + "' uses " + e + ", which a grammar cannot express here";
            return false;
        }
        Nfa n;
        auto [s, a] = n.build(tree);
        if (n.too_big) {
            *why = "'" + re + "' expands to more than " + std::to_string(kMaxNfaStates) + " states";
            return false;
        }
        n.start = s;
        n.accept = a;
        Dfa d;
        if (!determinize(n, &d, &e)) {
            *why = "'" + re + "': " + e;
            return false;
        }
        dfas.push_back(std::move(d));
    }
    // The product: one DFA state per expression and the length so far (capped where it stops
    // mattering: at max_len, or at min_len when unbounded).
    using Tuple = std::vector<int>;  // DFA states..., length
    std::map<Tuple, int> index;
    std::vector<Tuple> states;
    std::vector<std::vector<std::pair<CharSet, int>>> tr;
    std::vector<bool> accept;
    auto intern = [&](Tuple t) {
        auto [it, fresh] = index.emplace(t, int(states.size()));
        if (fresh) {
            states.push_back(std::move(t));
            tr.emplace_back();
            accept.push_back(false);
        }
        return it->second;
    };
    intern(Tuple(dfas.size() + 1, 0));
    for (size_t q = 0; q < states.size(); ++q) {
        if (int(states.size()) > kMaxStringStates) {
            *why = "the combination of its constraints needs more than " +
                   std::to_string(kMaxStringStates) + " automaton states";
            return false;
        }
        const Tuple cur = states[q];
        const int len = cur.back();
        bool acc = len >= min_len;
        std::vector<const CharSet *> all;
        for (size_t k = 0; k < dfas.size(); ++k) {
            const Dfa::State & ds = dfas[k].st[size_t(cur[k])];
            acc = acc && ds.accept;
            for (const auto & [cs, t] : ds.tr) all.push_back(&cs);
        }
        accept[q] = acc;
        if (max_len >= 0 && len >= max_len) continue;
        const CharSet any = kUniverse;
        if (dfas.empty()) all.push_back(&any);
        std::map<int, CharSet> by_target;
        for (const Range & p : pieces(all)) {
            Tuple next(cur.size());
            bool ok = true;
            for (size_t k = 0; k < dfas.size() && ok; ++k) {
                ok = false;
                for (const auto & [cs, t] : dfas[k].st[size_t(cur[k])].tr)
                    if (contains(cs, p.first)) {
                        next[k] = t;
                        ok = true;
                        break;
                    }
            }
            if (!ok) continue;
            next.back() = max_len >= 0 ? len + 1 : std::min(len + 1, min_len);
            by_target[intern(next)].push_back(p);
        }
        for (auto & [t, cs] : by_target) tr[q].emplace_back(normalized(cs), t);
    }
    // Live states: those from which an accepting state is reachable.
    const size_t n = states.size();
    std::vector<std::vector<int>> back(n);
    for (size_t q = 0; q < n; ++q)
        for (const auto & [cs, t] : tr[q]) back[size_t(t)].push_back(int(q));
    std::vector<bool> live(n, false);
    std::vector<int> stack;
    for (size_t q = 0; q < n; ++q)
        if (accept[q]) {
            live[q] = true;
            stack.push_back(int(q));
        }
    while (!stack.empty()) {
        const int q = stack.back();
        stack.pop_back();
        for (int p : back[size_t(q)])
            if (!live[size_t(p)]) {
                live[size_t(p)] = true;
                stack.push_back(p);
            }
    }
    if (!live[0]) {
        *why = "no string satisfies all of its constraints together";
        return false;
    }
    std::vector<int> name(n, -1);
    int next_name = 0;
    for (size_t q = 0; q < n; ++q)
        if (live[q]) name[q] = next_name++;
    auto rule = [&](int q) { return prefix + "-" + std::to_string(name[size_t(q)]); };
    for (size_t q = 0; q < n; ++q) {
        if (!live[q]) continue;
        std::string body;
        for (const auto & [cs, t] : tr[q]) {
            if (!live[size_t(t)]) continue;
            body += (body.empty() ? "" : " | ") + json_term(cs) + " " + rule(t);
        }
        if (accept[q]) body += std::string(body.empty() ? "" : " | ") + "\"\\\"\"";
        rules->emplace_back(rule(int(q)), body);
    }
    *expr = "\"\\\"\" " + rule(0);
    return true;
}

}  // namespace moestream::chat
