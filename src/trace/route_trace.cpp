// route_trace.cpp — route trace writer and reader (format: docs/route-trace.md).
#include "route_tracer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <new>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moestream/atomic_file.h"
#include "moestream/log.h"

namespace moestream {

static_assert(std::endian::native == std::endian::little,
              "route traces are little-endian; a big-endian host needs byte swapping here");

namespace {

constexpr uint8_t kTagRouting = 'R';
constexpr uint8_t kTagEnd = 'E';
constexpr uint8_t kTagReadAhead = 'A';
constexpr uint64_t kReadAheadHeadBytes = 16;  // tag, flags, 2 zero bytes, routing, layer, n
constexpr uint64_t kRecordHeadBytes = 28;  // tag, phase, k, layer, n_rows, pos, graph, bytes
constexpr uint64_t kSlotBytes = 8;         // u32 (id | flags << 24), f32 weight
constexpr uint64_t kEndBytes = 20;         // tag, 3 zero bytes, u64 records, u64 slots
constexpr size_t kFlushBytes = 1 << 20;

template <typename T>
void put(std::string & b, T v) {
    char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.append(tmp, sizeof(T));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Writer

std::unique_ptr<RouteTracer> RouteTracer::open(const std::string & path, const TraceHeader & h,
                                               uint64_t max_bytes) {
    std::unique_ptr<RouteTracer> t(new RouteTracer());
    t->path_ = path;
    t->max_bytes_ = max_bytes;
    t->n_expert_ = h.n_expert;
    t->scores_ = h.scores;
    t->resident_.assign(h.n_expert, 0);
    Status st = t->file_.create(path, "route trace");  // messages: "route trace: cannot ..."
    if (!st.ok()) {
        MS_LOG_WARN("%s; tracing is off, inference continues", st.message().c_str());
        return t;
    }
    t->fd_ = t->file_.fd();
    std::string & b = t->buf_;
    b.append(kRouteTraceMagic, sizeof kRouteTraceMagic);
    put<uint32_t>(b, kRouteTraceVersion);
    put<uint32_t>(b, h.n_layer);
    put<uint32_t>(b, h.n_expert);
    put<uint32_t>(b, h.k_model);
    put<uint32_t>(b, h.k);
    put<uint32_t>(b, uint32_t(h.moe_layers.size()));
    put<uint64_t>(b, h.page_bytes);
    put<uint64_t>(b, h.cache_budget_bytes);
    put<double>(b, h.drop_cold);
    put<uint32_t>(b, (h.drop_in_prefill ? 1u : 0u) | (h.drop_renorm ? 2u : 0u) |
                         (h.cache_chunks ? 4u : 0u) | (h.scores ? 8u : 0u));
    put<double>(b, h.substitute);
    put<uint32_t>(b, h.slots_per_layer);
    put<uint32_t>(b, h.slot_warm ? 1u : 0u);
    for (const TraceLayerShape & L : h.moe_layers) {
        put<uint32_t>(b, L.layer);
        put<uint32_t>(b, uint32_t(L.slice_bytes.size()));
        for (uint64_t s : L.slice_bytes) put<uint64_t>(b, s);
        for (size_t t = 0; t < L.slice_bytes.size(); ++t)
            put<uint64_t>(b, t < L.phase_bytes.size() ? L.phase_bytes[t] : 0);
    }
    put<uint32_t>(b, uint32_t(h.settings_json.size()));
    b += h.settings_json;
    t->flush(true);
    return t;
}

RouteTracer::~RouteTracer() = default;  // file_ removes an unfinished temporary file

void RouteTracer::fail(const std::string & what, int err) {
    MS_LOG_WARN("route trace: %s '%s': %s; tracing is off, inference continues", what.c_str(),
                file_.temp_path().c_str(), std::strerror(err));
    file_.discard();
    fd_ = -1;
    open_ = false;
    ra_open_ = false;
    ra_buf_.clear();
    buf_.clear();
    buf_.shrink_to_fit();
}

void RouteTracer::flush(bool force) {
    if (fd_ < 0 || buf_.empty() || (!force && buf_.size() < kFlushBytes)) return;
    const char * p = buf_.data();
    size_t left = buf_.size();
    while (left > 0) {
        const ssize_t n = ::write(fd_, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fail("cannot write", n < 0 ? errno : ENOSPC);
            return;
        }
        p += n;
        left -= size_t(n);
        written_ += uint64_t(n);
    }
    buf_.clear();
}

void RouteTracer::stop_full() {
    full_ = true;
    open_ = false;
    ra_open_ = false;
    ra_buf_.clear();
    if (graph_at_ >= written_) {
        buf_.resize(size_t(graph_at_ - written_));  // the cut graph is still in the buffer
    } else {  // part of it is on disk already: cut the file back to the graph's start
        buf_.clear();
        if (::ftruncate(fd_, off_t(graph_at_)) != 0 || ::lseek(fd_, off_t(graph_at_), SEEK_SET) < 0) {
            fail("cannot cut back", errno);
            return;
        }
        written_ = graph_at_;
    }
    n_records_ = graph_records_;
    n_slots_ = graph_slots_;
    MS_LOG_WARN("route trace: %s reached %.1f MiB, the most a trace reader accepts; it ends "
                "after %llu routings, before graph %u (position %u); inference continues",
                path_.c_str(), double(max_bytes_) / double(1 << 20),
                (unsigned long long)n_records_, graph_, pos0_);
    finish();
}

void RouteTracer::begin_graph(bool decode, uint32_t pos0, uint32_t n_tokens, bool prompt_end) {
    close_record();
    if (fd_ < 0) return;
    graph_at_ = written_ + buf_.size();
    graph_records_ = n_records_;
    graph_slots_ = n_slots_;
    if (graph_started_) ++graph_;
    graph_started_ = true;
    decode_ = decode;
    prompt_end_ = prompt_end && !decode;
    pos0_ = pos0;
    n_tokens_ = n_tokens;
}

void RouteTracer::routing_start(uint32_t layer, int k, int n_rows, const int32_t * ids) {
    if (fd_ < 0) return;
    close_record();
    open_ = true;
    have_weights_ = false;
    cur_ = TraceRouting{};
    cur_.layer = layer;
    cur_.k = uint16_t(k);
    cur_.n_rows = uint32_t(n_rows);
    cur_.decode = decode_ ? 1 : 0;
    cur_.prompt_end = prompt_end_ ? 1 : 0;
    cur_.graph = graph_;
    // Rows are the batch's tokens, or (last layer) only its outputs: the last n_rows tokens.
    cur_.pos = uint32_t(n_rows) >= n_tokens_ ? pos0_ : pos0_ + n_tokens_ - uint32_t(n_rows);
    const size_t n = size_t(k) * size_t(n_rows);
    ids_.assign(ids, ids + n);
    weight_.assign(n, std::nanf(""));
    flags_.assign(n, 0);
    score_rows_ = 0;
    if (scores_ && decode_ && stash_layer_ == int64_t(layer) &&
        stash_order_.size() == size_t(n_rows) * n_expert_) {
        score_rows_ = uint32_t(n_rows);
        order_.swap(stash_order_);
        scores_row_.swap(stash_scores_);
    }
    stash_layer_ = -1;
}

void RouteTracer::stash_scores(uint32_t layer, int n_rows, int n, const int32_t * order,
                               int64_t order_row, const float * scores, int64_t score_row) {
    stash_layer_ = -1;
    if (!wants_scores() || n != int(n_expert_) || n_rows <= 0) return;
    stash_order_.resize(size_t(n_rows) * size_t(n));
    stash_scores_.resize(size_t(n_rows) * size_t(n));
    for (int row = 0; row < n_rows; ++row)
        for (int e = 0; e < n; ++e) {
            const int32_t id = order[row * order_row + e];
            if (id < 0 || id >= n) return;  // not a permutation: recorded without scores
            stash_order_[size_t(row) * size_t(n) + size_t(e)] = uint16_t(id);
            stash_scores_[size_t(row) * size_t(n) + size_t(e)] = scores[row * score_row + e];
        }
    stash_layer_ = int64_t(layer);
}

void RouteTracer::on_stage(uint32_t layer, const std::vector<uint32_t> & experts,
                           const std::vector<uint8_t> & resident, uint64_t bytes_read) {
    if (!open_ || layer != cur_.layer) return;
    for (size_t i = 0; i < experts.size(); ++i)
        if (experts[i] < n_expert_) resident_[experts[i]] = resident[i];
    for (size_t s = 0; s < ids_.size(); ++s)
        if (!(flags_[s] & kSlotDropped) && resident_[size_t(ids_[s])]) flags_[s] |= kSlotResident;
    for (uint32_t e : experts)
        if (e < n_expert_) resident_[e] = 0;
    cur_.bytes_read += bytes_read;
}

void RouteTracer::on_read_ahead(uint32_t layer, const std::vector<uint32_t> & guess,
                                const std::vector<uint32_t> & committed, bool shared,
                                bool one_token) {
    if (fd_ < 0) return;
    if (ra_open_) put_read_ahead(false);  // (the store ends every call; never reached)
    ra_open_ = true;
    ra_flags_ = uint8_t((shared ? kReadAheadShared : 0) | (one_token ? kReadAheadOneToken : 0));
    ra_routing_ = open_ ? uint32_t(n_records_) : uint32_t(n_records_ ? n_records_ - 1 : 0);
    ra_layer_ = layer;
    ra_experts_.clear();
    for (uint32_t e : guess)
        if (e < n_expert_) {
            // Committed: marked at its first place in the guess only.
            const bool c = std::find(committed.begin(), committed.end(), e) != committed.end() &&
                           std::find(ra_experts_.begin(), ra_experts_.end(),
                                     e | kReadAheadCommitted) == ra_experts_.end();
            ra_experts_.push_back(e | (c ? kReadAheadCommitted : 0u));
        }
    if (committed.empty()) put_read_ahead(true);
}

void RouteTracer::on_read_ahead_end(bool ok) {
    if (fd_ < 0 || !ra_open_) return;
    put_read_ahead(ok);
}

void RouteTracer::put_read_ahead(bool ok) {
    ra_open_ = false;
    std::string & b = open_ ? ra_buf_ : buf_;  // after the open routing record
    put<uint8_t>(b, kTagReadAhead);
    put<uint8_t>(b, uint8_t(ra_flags_ | (ok ? kReadAheadOk : 0)));
    b.append(2, '\0');
    put<uint32_t>(b, ra_routing_);
    put<uint32_t>(b, ra_layer_);
    put<uint32_t>(b, uint32_t(ra_experts_.size()));
    for (uint32_t e : ra_experts_) put<uint32_t>(b, e);
}

void RouteTracer::close_record() {
    if (!open_) return;
    open_ = false;
    if (fd_ < 0) return;
    put<uint8_t>(buf_, kTagRouting);
    put<uint8_t>(buf_, cur_.decode ? 1 : cur_.prompt_end ? 2 : 0);  // phase
    put<uint16_t>(buf_, cur_.k);
    put<uint32_t>(buf_, cur_.layer);
    put<uint32_t>(buf_, cur_.n_rows);
    put<uint32_t>(buf_, cur_.pos);
    put<uint32_t>(buf_, cur_.graph);
    put<uint64_t>(buf_, cur_.bytes_read);
    for (size_t s = 0; s < ids_.size(); ++s) {
        put<uint32_t>(buf_, uint32_t(ids_[s]) | (uint32_t(flags_[s]) << 24));
        put<float>(buf_, weight_[s]);
    }
    if (scores_ && cur_.decode) {  // the scores block: rows, then per row order and scores
        put<uint32_t>(buf_, score_rows_);
        for (uint32_t row = 0; row < score_rows_; ++row) {
            const size_t at = size_t(row) * n_expert_;
            buf_.append(reinterpret_cast<const char *>(order_.data() + at), 2 * size_t(n_expert_));
            buf_.append(reinterpret_cast<const char *>(scores_row_.data() + at),
                        4 * size_t(n_expert_));
        }
    }
    ++n_records_;
    n_slots_ += ids_.size();
    buf_ += ra_buf_;
    ra_buf_.clear();
    if (written_ + buf_.size() + kEndBytes > max_bytes_) {
        stop_full();
        return;
    }
    flush(false);
}

void RouteTracer::finish() {
    if (fd_ < 0) return;
    close_record();
    put<uint8_t>(buf_, kTagEnd);
    buf_.append(3, '\0');
    put<uint64_t>(buf_, n_records_);
    put<uint64_t>(buf_, n_slots_);
    flush(true);
    if (fd_ < 0) return;
    fd_ = -1;
    Status st = file_.commit();  // fsync, close, rename over the target
    if (!st.ok()) {
        MS_LOG_WARN("%s; no trace written", st.message().c_str());
        return;
    }
    MS_LOG_INFO("route trace: %llu routings, %llu slots -> %s", (unsigned long long)n_records_,
                (unsigned long long)n_slots_, path_.c_str());
}

// ---------------------------------------------------------------------------------------
// Reader

namespace {

class Cursor {
public:
    Cursor(const uint8_t * d, uint64_t n, const std::string & name) : d_(d), n_(n), name_(name) {}
    uint64_t off() const { return off_; }
    uint64_t left() const { return n_ - off_; }
    Status err(uint64_t at, const std::string & what) const {
        return Status::BadInput(name_ + ": offset " + std::to_string(at) + ": " + what);
    }
    template <typename T>
    Status get(T * v, const char * what) {
        if (left() < sizeof(T))
            return err(off_, std::string("truncated: ") + what + " needs " +
                                 std::to_string(sizeof(T)) + " bytes, " + std::to_string(left()) +
                                 " left");
        std::memcpy(v, d_ + off_, sizeof(T));
        off_ += sizeof(T);
        return Status::Ok();
    }
    const uint8_t * ptr() const { return d_ + off_; }
    void skip(uint64_t n) { off_ += n; }

private:
    const uint8_t * d_;
    uint64_t n_;
    uint64_t off_ = 0;
    const std::string & name_;
};

#define MS_TRY(expr)               \
    do {                           \
        Status _st = (expr);       \
        if (!_st.ok()) return _st; \
    } while (0)

// The scores block of a decode record (header.scores): u32 rows (0 or n_rows), then per row
// n_expert u16 router order and n_expert f32 scores by expert id. The order must be a
// permutation whose scores do not increase (it is the argsort of those scores), and the
// record's slots must be its first k, except substituted slots, which hold an expert ranked
// below the top k.
Status parse_scores(Cursor & c, const TraceHeader & h, uint64_t rec, TraceRouting * r,
                    RouteTrace * out) {
    const std::string where = "routing record at offset " + std::to_string(rec) + ": scores: ";
    uint64_t at = c.off();
    MS_TRY(c.get(&r->score_rows, "scores row count"));
    if (r->score_rows != 0 && r->score_rows != r->n_rows)
        return c.err(at, where + std::to_string(r->score_rows) + " rows, the record has " +
                             std::to_string(r->n_rows));
    const uint64_t n = h.n_expert, row_bytes = 6 * n;
    if (c.left() / row_bytes < r->score_rows)
        return c.err(c.off(), "truncated: " + where + std::to_string(r->score_rows) +
                                  " rows need " + std::to_string(r->score_rows * row_bytes) +
                                  " bytes, " + std::to_string(c.left()) + " left");
    r->first_score_row = out->scores.size() / n;
    std::vector<uint32_t> rank(n);
    for (uint32_t row = 0; row < r->score_rows; ++row) {
        const uint64_t row_at = c.off();
        const uint8_t * p = c.ptr();
        const size_t base = out->scores.size();
        out->score_order.resize(base + n);
        out->scores.resize(base + n);
        std::memcpy(out->score_order.data() + base, p, 2 * n);
        std::memcpy(out->scores.data() + base, p + 2 * n, 4 * n);
        const uint16_t * ord = out->score_order.data() + base;
        const float * sc = out->scores.data() + base;
        const std::string rw = where + "row " + std::to_string(row) + ": ";
        std::fill(rank.begin(), rank.end(), uint32_t(n));
        for (uint64_t q = 0; q < n; ++q) {
            if (ord[q] >= n || rank[ord[q]] != n)
                return c.err(row_at + 2 * q, rw + "the router order is not a permutation of "
                                                  "the experts (rank " + std::to_string(q) +
                                                  ": expert " + std::to_string(ord[q]) + ")");
            rank[ord[q]] = uint32_t(q);
        }
        for (uint64_t e = 0; e < n; ++e)
            if (!std::isfinite(sc[e]))
                return c.err(row_at + 2 * n + 4 * e,
                             rw + "expert " + std::to_string(e) + "'s score is not finite");
        for (uint64_t q = 1; q < n; ++q)
            if (sc[ord[q]] > sc[ord[q - 1]])
                return c.err(row_at + 2 * n + 4 * uint64_t(ord[q]),
                             rw + "expert " + std::to_string(ord[q]) + " at rank " +
                                 std::to_string(q) + " scores above the expert ranked before it");
        for (uint32_t j = 0; j < r->k; ++j) {
            const uint64_t s = r->first_slot + uint64_t(row) * r->k + j;
            const uint32_t e = uint32_t(out->expert[s]);
            const bool sub = out->flags[s] & kSlotSubstituted;
            if (sub ? rank[e] < r->k : rank[e] != j)
                return c.err(row_at, rw + "slot " + std::to_string(j) + " (expert " +
                                         std::to_string(e) + ", router rank " +
                                         std::to_string(rank[e]) + ") " +
                                         (sub ? "is marked substituted but was routed"
                                              : "is not the router's rank " + std::to_string(j)));
        }
        c.skip(row_bytes);
    }
    return Status::Ok();
}

// A read-ahead record (version 8) at the cursor; it follows the routing it names.
Status parse_read_ahead(Cursor & c, const TraceHeader & h, const std::vector<int32_t> & layer_to_moe,
                        RouteTrace * out) {
    const uint64_t rec = c.off();
    if (c.left() < kReadAheadHeadBytes)
        return c.err(rec, "truncated read-ahead record (" + std::to_string(c.left()) +
                              " bytes left, the head needs " +
                              std::to_string(kReadAheadHeadBytes) + ")");
    TraceReadAhead a;
    a.offset = rec;
    uint8_t tag = 0, pad[2] = {0, 0};
    MS_TRY(c.get(&tag, "tag"));
    MS_TRY(c.get(&a.flags, "read-ahead flags"));
    MS_TRY(c.get(&pad[0], "padding"));
    MS_TRY(c.get(&pad[1], "padding"));
    MS_TRY(c.get(&a.routing, "read-ahead routing"));
    MS_TRY(c.get(&a.layer, "read-ahead layer"));
    MS_TRY(c.get(&a.n, "read-ahead experts"));
    if (a.flags & ~kReadAheadKnownFlags)
        return c.err(rec + 1, "unknown read-ahead flags " + std::to_string(a.flags));
    if (pad[0] || pad[1]) return c.err(rec + 2, "nonzero padding in a read-ahead record");
    if (a.routing >= out->routings.size() ||
        (!out->read_aheads.empty() && a.routing < out->read_aheads.back().routing))
        return c.err(rec + 4, "read-ahead names routing #" + std::to_string(a.routing) +
                                  ", not one of the " + std::to_string(out->routings.size()) +
                                  " before it in order");
    if (a.layer >= h.n_layer || layer_to_moe[a.layer] < 0)
        return c.err(rec + 8,
                     "layer " + std::to_string(a.layer) + " is not a MoE layer of the header");
    a.moe_idx = uint32_t(layer_to_moe[a.layer]);
    if (a.n > h.n_expert)
        return c.err(rec + 12, std::to_string(a.n) + " experts guessed, more than the " +
                                   std::to_string(h.n_expert) + " of a layer");
    if (c.left() / 4 < a.n)
        return c.err(c.off(), "truncated: " + std::to_string(a.n) + " read-ahead experts need " +
                                  std::to_string(4 * uint64_t(a.n)) + " bytes, " +
                                  std::to_string(c.left()) + " left");
    a.first = out->read_ahead_experts.size();
    for (uint32_t i = 0; i < a.n; ++i) {
        const uint64_t at = c.off();
        uint32_t e = 0;
        MS_TRY(c.get(&e, "read-ahead expert"));
        if ((e & ~kReadAheadCommitted) >= h.n_expert)
            return c.err(at, "expert id " + std::to_string(e & ~kReadAheadCommitted) +
                                 " >= n_expert " + std::to_string(h.n_expert));
        a.committed += (e & kReadAheadCommitted) ? 1 : 0;
        out->read_ahead_experts.push_back(e);
    }
    out->read_aheads.push_back(a);
    return Status::Ok();
}

}  // namespace

Status parse_route_trace(const uint8_t * data, uint64_t size, const std::string & name,
                         RouteTrace * out) {
    *out = RouteTrace{};
    out->file_bytes = size;
    Cursor c(data, size, name);
    TraceHeader & h = out->header;
    if (size < sizeof kRouteTraceMagic ||
        std::memcmp(data, kRouteTraceMagic, sizeof kRouteTraceMagic) != 0)
        return c.err(0, "not a moestream route trace (bad magic)");
    c.skip(sizeof kRouteTraceMagic);
    uint64_t at = c.off();
    MS_TRY(c.get(&h.version, "version"));
    if (h.version < 1 || h.version > kRouteTraceVersion)
        return c.err(at, "unsupported trace version " + std::to_string(h.version) +
                             " (this build reads 1 to " + std::to_string(kRouteTraceVersion) + ")");
    uint32_t n_moe = 0, hflags = 0;
    at = c.off();
    MS_TRY(c.get(&h.n_layer, "n_layer"));
    MS_TRY(c.get(&h.n_expert, "n_expert"));
    MS_TRY(c.get(&h.k_model, "k_model"));
    MS_TRY(c.get(&h.k, "k"));
    MS_TRY(c.get(&n_moe, "n_moe_layers"));
    // Bounded by what a real model can have (llama.cpp's 512 layers; experts far above any
    // released model), so the replay's per-expert arrays (MoE layers x experts) stay small.
    if (h.n_layer == 0 || h.n_layer > kTraceMaxLayers || h.n_expert == 0 ||
        h.n_expert > kTraceMaxExperts || h.k == 0 || h.k > h.k_model || h.k_model > h.n_expert ||
        n_moe == 0 || n_moe > h.n_layer || uint64_t(n_moe) * h.n_expert > kTraceMaxLayerExperts)
        return c.err(at, "implausible model shape (n_layer " + std::to_string(h.n_layer) +
                             ", n_expert " + std::to_string(h.n_expert) + ", k " +
                             std::to_string(h.k) + " of " + std::to_string(h.k_model) +
                             ", MoE layers " + std::to_string(n_moe) + ")");
    at = c.off();
    MS_TRY(c.get(&h.page_bytes, "page_bytes"));
    if (h.page_bytes < 512 || h.page_bytes > (1u << 30) || (h.page_bytes & (h.page_bytes - 1)) != 0)
        return c.err(at, "page size " + std::to_string(h.page_bytes) +
                             " is not a power of two in [512, 1 GiB]");
    MS_TRY(c.get(&h.cache_budget_bytes, "cache budget"));
    at = c.off();
    MS_TRY(c.get(&h.drop_cold, "drop_cold"));
    if (!(h.drop_cold >= 0 && h.drop_cold <= 1))
        return c.err(at, "drop-cold fraction outside [0, 1]");
    at = c.off();
    MS_TRY(c.get(&hflags, "settings flags"));
    const uint32_t known = h.version >= 6 ? 15u : h.version >= 3 ? 7u : 3u;
    if (hflags & ~known) return c.err(at, "unknown settings flags " + std::to_string(hflags));
    h.drop_in_prefill = hflags & 1;
    h.drop_renorm = hflags & 2;
    h.cache_chunks = hflags & 4;
    h.scores = hflags & 8;
    if (h.version >= 6) {
        at = c.off();
        MS_TRY(c.get(&h.substitute, "substitute margin"));
        if (!(h.substitute >= 0 && h.substitute <= 1))
            return c.err(at, "substitute margin outside [0, 1]");
    }
    if (h.version >= 7) {
        at = c.off();
        MS_TRY(c.get(&h.slots_per_layer, "slots per layer"));
        if (h.slots_per_layer > h.n_expert)
            return c.err(at, "slots per layer " + std::to_string(h.slots_per_layer) +
                                 " above the experts per layer " + std::to_string(h.n_expert));
        at = c.off();
        uint32_t sflags = 0;
        MS_TRY(c.get(&sflags, "slot flags"));
        if (sflags & ~1u) return c.err(at, "unknown slot flags " + std::to_string(sflags));
        h.slot_warm = sflags & 1;
    }
    std::vector<int32_t> layer_to_moe(h.n_layer, -1);
    for (uint32_t i = 0; i < n_moe; ++i) {
        TraceLayerShape L;
        uint32_t n_proj = 0;
        at = c.off();
        MS_TRY(c.get(&L.layer, "MoE layer index"));
        MS_TRY(c.get(&n_proj, "projection count"));
        if (L.layer >= h.n_layer || (i > 0 && L.layer <= h.moe_layers.back().layer))
            return c.err(at,
                         "MoE layer " + std::to_string(L.layer) + " out of order or >= n_layer");
        if (n_proj == 0 || n_proj > 16)
            return c.err(at, "MoE layer " + std::to_string(L.layer) + ": " +
                                 std::to_string(n_proj) + " projections");
        for (uint32_t t = 0; t < n_proj; ++t) {
            uint64_t s = 0;
            at = c.off();
            MS_TRY(c.get(&s, "slice bytes"));
            if (s == 0 || s > (uint64_t(1) << 40))
                return c.err(at, "slice bytes " + std::to_string(s));
            L.slice_bytes.push_back(s);
            L.expert_bytes += s;
        }
        L.phase_bytes.assign(n_proj, 0);
        for (uint32_t t = 0; t < n_proj && h.version >= 2; ++t) {
            at = c.off();
            MS_TRY(c.get(&L.phase_bytes[t], "page phase"));
            if (L.phase_bytes[t] >= h.page_bytes)
                return c.err(at, "page phase " + std::to_string(L.phase_bytes[t]) +
                                     " not below the page size " + std::to_string(h.page_bytes));
        }
        layer_to_moe[L.layer] = int32_t(i);
        h.moe_layers.push_back(std::move(L));
    }
    uint32_t json_len = 0;
    at = c.off();
    MS_TRY(c.get(&json_len, "settings length"));
    if (json_len > c.left())
        return c.err(at, "truncated: settings need " + std::to_string(json_len) + " bytes, " +
                             std::to_string(c.left()) + " left");
    h.settings_json.assign(reinterpret_cast<const char *>(c.ptr()), json_len);
    if (json_len > 0 && nlohmann::json::parse(h.settings_json, nullptr, false).is_discarded())
        return c.err(c.off(), "settings are not valid JSON");
    c.skip(json_len);

    // Records. Reserve from the size (an upper bound: every slot costs 8 bytes), at most 1 Mi
    // slots up front: beyond that the arrays grow with the records that actually parse.
    const size_t guess = size_t(std::min<uint64_t>(c.left() / kSlotBytes, 1u << 20));
    out->expert.reserve(guess);
    out->weight.reserve(guess);
    out->flags.reserve(guess);
    uint32_t last_graph = 0;
    while (true) {
        const uint64_t rec = c.off();
        if (c.left() == 0)
            return c.err(rec, "truncated: no end marker (the trace was not finished)");
        const uint8_t tag = *c.ptr();
        if (tag == kTagEnd) {
            if (c.left() < kEndBytes)
                return c.err(rec, "truncated end marker (" + std::to_string(c.left()) + " of " +
                                      std::to_string(kEndBytes) + " bytes)");
            uint64_t n_rec = 0, n_slot = 0;
            std::memcpy(&n_rec, c.ptr() + 4, 8);
            std::memcpy(&n_slot, c.ptr() + 12, 8);
            if (c.ptr()[1] || c.ptr()[2] || c.ptr()[3])
                return c.err(rec + 1, "nonzero padding in the end marker");
            if (n_rec != out->routings.size() || n_slot != out->expert.size())
                return c.err(rec, "end marker counts " + std::to_string(n_rec) + " routings / " +
                                      std::to_string(n_slot) + " slots, the file holds " +
                                      std::to_string(out->routings.size()) + " / " +
                                      std::to_string(out->expert.size()));
            if (c.left() != kEndBytes)
                return c.err(rec + kEndBytes, std::to_string(c.left() - kEndBytes) +
                                                  " trailing bytes after the end marker");
            break;
        }
        if (tag == kTagReadAhead && h.version >= 8) {
            MS_TRY(parse_read_ahead(c, h, layer_to_moe, out));
            continue;
        }
        if (tag != kTagRouting) return c.err(rec, "unknown record tag " + std::to_string(tag));
        if (c.left() < kRecordHeadBytes)
            return c.err(rec, "truncated routing record (" + std::to_string(c.left()) +
                                  " bytes left, the head needs " +
                                  std::to_string(kRecordHeadBytes) + ")");
        TraceRouting r;
        uint8_t tag_again = 0;
        r.offset = rec;
        MS_TRY(c.get(&tag_again, "tag"));
        MS_TRY(c.get(&r.decode, "phase"));
        MS_TRY(c.get(&r.k, "k"));
        MS_TRY(c.get(&r.layer, "layer"));
        MS_TRY(c.get(&r.n_rows, "rows"));
        MS_TRY(c.get(&r.pos, "position"));
        MS_TRY(c.get(&r.graph, "graph"));
        MS_TRY(c.get(&r.bytes_read, "bytes read"));
        if (r.decode > (h.version >= 7 ? 2 : 1))
            return c.err(rec + 1, "phase " + std::to_string(r.decode) +
                                      (h.version >= 7 ? " is neither prefill (0), decode (1) "
                                                        "nor the prompt's end (2)"
                                                      : " is neither prefill (0) nor decode (1)"));
        r.prompt_end = r.decode == 2;
        if (r.prompt_end) r.decode = 0;
        if (r.k != h.k)
            return c.err(rec + 2, "k " + std::to_string(r.k) + " differs from the header's " +
                                      std::to_string(h.k));
        if (r.layer >= h.n_layer || layer_to_moe[r.layer] < 0)
            return c.err(rec + 4,
                         "layer " + std::to_string(r.layer) + " is not a MoE layer of the header");
        if (r.n_rows == 0 || r.n_rows > (1u << 24))
            return c.err(rec + 8, "row count " + std::to_string(r.n_rows));
        if (r.graph < last_graph) return c.err(rec + 16, "graph index goes backwards");
        last_graph = r.graph;
        r.moe_idx = uint32_t(layer_to_moe[r.layer]);
        const uint64_t n = uint64_t(r.n_rows) * r.k;
        if (c.left() / kSlotBytes < n)
            return c.err(c.off(), "truncated: " + std::to_string(n) + " slots need " +
                                      std::to_string(n * kSlotBytes) + " bytes, " +
                                      std::to_string(c.left()) + " left");
        r.first_slot = out->expert.size();
        const uint8_t * p = c.ptr();
        for (uint64_t s = 0; s < n; ++s, p += kSlotBytes) {
            uint32_t word;
            float w;
            std::memcpy(&word, p, 4);
            std::memcpy(&w, p + 4, 4);
            const uint32_t id = word & 0xFFFFFFu;
            const uint8_t fl = uint8_t(word >> 24);
            const uint64_t so = c.off() + s * kSlotBytes;
            if (id >= h.n_expert)
                return c.err(so, "expert id " + std::to_string(id) + " >= n_expert " +
                                     std::to_string(h.n_expert));
            const uint8_t known =
                h.version >= 5   ? kSlotKnownFlags
                : h.version >= 4 ? uint8_t(kSlotResident | kSlotDropped | kSlotSubstituted)
                                 : uint8_t(kSlotResident | kSlotDropped);
            if ((fl & ~known) || ((fl & kSlotDropped) && (fl & kSlotResident)) ||
                ((fl & kSlotSubstituted) && (fl & kSlotDropped)) ||
                ((fl & kSlotFallback) && (fl & (kSlotDropped | kSlotSubstituted))))
                return c.err(so, "invalid slot flags " + std::to_string(fl));
            out->expert.push_back(int32_t(id));
            out->weight.push_back(w);
            out->flags.push_back(fl);
        }
        c.skip(n * kSlotBytes);
        if (h.scores && r.decode) MS_TRY(parse_scores(c, h, rec, &r, out));
        out->routings.push_back(r);
    }
    return Status::Ok();
}

Status read_route_trace(const std::string & path, RouteTrace * out) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files are read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return Status::BadInput(path + ": cannot open: " + std::strerror(errno));
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0)
        return Status::BadInput(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        return Status::BadInput(path + ": not a regular file (" + file_kind(st.st_mode) +
                                "): a route trace is read from a file");
    // The header first: anything else (a model file given by mistake) fails after 8 bytes.
    auto read_at = [&](uint8_t * dst, uint64_t n, uint64_t off, uint64_t * got) -> Status {
        *got = 0;
        while (*got < n) {
            const ssize_t r = ::pread(fd, dst + *got, n - *got, off_t(off + *got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0)
                return Status::BadInput(path + ": offset " + std::to_string(off + *got) +
                                        ": read failed: " + std::strerror(errno));
            if (r == 0) break;
            *got += uint64_t(r);
        }
        return Status::Ok();
    };
    uint8_t magic[sizeof kRouteTraceMagic];
    uint64_t got = 0;
    Status rs = read_at(magic, sizeof magic, 0, &got);
    if (!rs.ok()) return rs;
    if (got < sizeof magic || std::memcmp(magic, kRouteTraceMagic, sizeof magic) != 0)
        return Status::BadInput(path + ": offset 0: not a moestream route trace (bad magic)");
    const uint64_t size = uint64_t(st.st_size);
    if (size > kTraceMaxFileBytes)
        return Status::BadInput(path + ": " + std::to_string(size) +
                                " bytes, more than the " + std::to_string(kTraceMaxFileBytes >> 20) +
                                " MiB a route trace may have");
    try {
        std::vector<uint8_t> data(size_t(size) + 1);  // one more: a file that grew is not cut
        rs = read_at(data.data(), size + 1, 0, &got);
        if (!rs.ok()) return rs;
        if (got != size)
            return Status::BadInput(path + ": the file changed size while being read (" +
                                    std::to_string(size) + " -> " + std::to_string(got) +
                                    (got > size ? "+" : "") + " bytes)");
        return parse_route_trace(data.data(), size, path, out);
    } catch (const std::bad_alloc &) {
        *out = RouteTrace{};
        return Status::BadInput(path + ": out of memory holding the trace (" +
                                std::to_string(size) + " bytes)");
    }
}

}  // namespace moestream
