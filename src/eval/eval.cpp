// eval.cpp — see eval.h.
#include "moestream/eval.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace moestream {
namespace {

constexpr char kMagic[8] = {'M', 'S', 'E', 'V', 'R', 'E', 'F', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 8 + 4 * 4 + 8 + 8;

// log-sum-exp of x[0..n) in double; -inf if any value is NaN or +inf.
double log_sum_exp(const float * x, int n, bool * finite) {
    double mx = -std::numeric_limits<double>::infinity();
    *finite = true;
    for (int i = 0; i < n; ++i) {
        if (!std::isfinite(x[i]) && !(std::isinf(x[i]) && x[i] < 0)) *finite = false;
        mx = std::max(mx, double(x[i]));
    }
    if (!*finite || !std::isfinite(mx)) {
        *finite = false;
        return 0;
    }
    double s = 0;
    for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
    return mx + std::log(s);
}

int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

Interval percentile_interval(std::vector<double> boots, double value) {
    Interval iv;
    iv.value = value;
    if (boots.empty()) {
        iv.lo = iv.hi = value;
        return iv;
    }
    std::sort(boots.begin(), boots.end());
    auto at = [&](double q) {
        const double pos = q * double(boots.size() - 1);
        const size_t i = size_t(pos);
        const double f = pos - double(i);
        return i + 1 < boots.size() ? boots[i] * (1 - f) + boots[i + 1] * f : boots[i];
    };
    iv.lo = at(0.025);
    iv.hi = at(0.975);
    return iv;
}

}  // namespace

PositionMetrics compare_logits(const float * ref, const float * run, int n_vocab, int32_t next) {
    PositionMetrics m;
    const double inf = std::numeric_limits<double>::infinity();
    bool ok_ref = false, ok_run = false;
    const double lse_ref = log_sum_exp(ref, n_vocab, &ok_ref);
    const double lse_run = log_sum_exp(run, n_vocab, &ok_run);
    const bool in_vocab = next >= 0 && next < n_vocab;
    m.nll_ref = ok_ref && in_vocab ? lse_ref - double(ref[next]) : inf;
    m.nll_run = ok_run && in_vocab ? lse_run - double(run[next]) : inf;
    if (!ok_ref || !ok_run) {
        m.kl = inf;
        m.top1 = false;
        return m;
    }
    double kl = 0;
    for (int v = 0; v < n_vocab; ++v) {
        const double lp_ref = double(ref[v]) - lse_ref;
        const double lp_run = double(run[v]) - lse_run;
        const double p = std::exp(lp_ref);
        if (p > 0) kl += p * (lp_ref - lp_run);
    }
    m.kl = std::max(0.0, kl);  // rounding can make an exact match a hair negative
    m.top1 = argmax(ref, n_vocab) == argmax(run, n_vocab);
    return m;
}

Status summarize_eval(const std::vector<PositionMetrics> & pos, int B, EvalSummary * out) {
    if (pos.empty()) return Status::BadInput("no position was scored (the text is one token?)");
    const size_t n = pos.size();
    auto stat = [&](const std::vector<size_t> * idx, double * nr, double * nf, double * kl,
                    double * t1) {
        double a = 0, b = 0, c = 0, d = 0;
        for (size_t j = 0; j < n; ++j) {
            const PositionMetrics & m = pos[idx ? (*idx)[j] : j];
            a += m.nll_run;
            b += m.nll_ref;
            c += m.kl;
            d += m.top1 ? 1 : 0;
        }
        *nr = std::exp(a / double(n));
        *nf = std::exp(b / double(n));
        *kl = c / double(n);
        *t1 = 100.0 * d / double(n);
    };
    double v_run, v_ref, v_kl, v_t1;
    stat(nullptr, &v_run, &v_ref, &v_kl, &v_t1);
    std::vector<double> b_run, b_ref, b_kl, b_t1;
    std::mt19937_64 rng(20261129);
    std::uniform_int_distribution<size_t> pick(0, n - 1);
    std::vector<size_t> idx(n);
    for (int r = 0; r < B; ++r) {
        for (auto & i : idx) i = pick(rng);
        double x, y, z, w;
        stat(&idx, &x, &y, &z, &w);
        b_run.push_back(x);
        b_ref.push_back(y);
        b_kl.push_back(z);
        b_t1.push_back(w);
    }
    out->positions = n;
    out->ppl_run = percentile_interval(std::move(b_run), v_run);
    out->ppl_ref = percentile_interval(std::move(b_ref), v_ref);
    out->mean_kl = percentile_interval(std::move(b_kl), v_kl);
    out->top1_pct = percentile_interval(std::move(b_t1), v_t1);
    return Status::Ok();
}

uint64_t hash_tokens(const std::vector<int32_t> & toks) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t t : toks) {
        uint32_t u = uint32_t(t);
        for (int i = 0; i < 4; ++i) {
            h ^= (u >> (8 * i)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

RefLogitsFile::~RefLogitsFile() {
    if (f_) std::fclose(f_);
    if (writing_) file_.fd_closed();  // fclose closed it; file_ removes the temporary file
}

Status RefLogitsFile::err(const std::string & what) const {
    return Status::BadInput(path_ + ": " + what);
}

Status RefLogitsFile::create(const std::string & path, int n_vocab, uint32_t n_pos, uint32_t window,
                             uint64_t tokens_hash, uint64_t model_bytes) {
    path_ = path;
    n_vocab_ = n_vocab;
    n_pos_ = n_pos;
    Status st = file_.create(path, "--save-ref");
    if (!st.ok()) return st;
    f_ = ::fdopen(file_.fd(), "wb");
    if (!f_) return Status::BadInput(file_.temp_path() + ": cannot create: " + std::strerror(errno));
    writing_ = true;
    const std::string & tmp_ = file_.temp_path();  // for the messages below
    const uint32_t hdr[4] = {kVersion, uint32_t(n_vocab), n_pos, window};
    if (std::fwrite(kMagic, 1, 8, f_) != 8 || std::fwrite(hdr, 4, 4, f_) != 4 ||
        std::fwrite(&tokens_hash, 8, 1, f_) != 1 || std::fwrite(&model_bytes, 8, 1, f_) != 1)
        return Status::BadInput(tmp_ + ": cannot write: " + std::strerror(errno));
    return Status::Ok();
}

Status RefLogitsFile::append(int32_t next, const float * logits) {
    if (!f_ || !writing_ || done_ >= n_pos_) return Status::Runtime(path_ + ": internal: append");
    if (std::fwrite(&next, 4, 1, f_) != 1 ||
        std::fwrite(logits, sizeof(float), size_t(n_vocab_), f_) != size_t(n_vocab_))
        return Status::BadInput(file_.temp_path() + ": cannot write: " + std::strerror(errno));
    ++done_;
    return Status::Ok();
}

Status RefLogitsFile::finish() {
    if (!f_ || !writing_) return Status::Ok();
    if (done_ != n_pos_)
        return Status::Runtime(path_ + ": internal: " + std::to_string(done_) + " of " +
                               std::to_string(n_pos_) + " positions written");
    const bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
    const int e = errno;
    const bool closed = std::fclose(f_) == 0;  // closes file_'s descriptor too
    f_ = nullptr;
    file_.fd_closed();
    writing_ = false;
    if (!ok || !closed) {
        const Status st = Status::BadInput(file_.temp_path() + ": cannot write: " +
                                          std::strerror(ok ? errno : e));
        file_.discard();
        return st;
    }
    return file_.commit();  // rename over path_ (never over a special file)
}

Status RefLogitsFile::open(const std::string & path, int n_vocab, uint32_t n_pos, uint32_t window,
                           uint64_t tokens_hash, uint64_t model_bytes) {
    path_ = path;
    n_vocab_ = n_vocab;
    n_pos_ = n_pos;
    // A reference is a file --save-ref wrote: a FIFO would block the open, a device never end.
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return err(std::string("cannot open: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        return err(std::string("is ") + file_kind(st.st_mode) + ", not a regular file (a reference "
                   "is a file --save-ref wrote)");
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) return err(std::string("cannot open: ") + std::strerror(errno));
    if (::fstat(::fileno(f_), &st) != 0 || !S_ISREG(st.st_mode))
        return err("is not a regular file (replaced while opening)");
    char magic[8];
    uint32_t hdr[4];
    uint64_t th = 0, mb = 0;
    if (std::fread(magic, 1, 8, f_) != 8 || std::memcmp(magic, kMagic, 8) != 0)
        return err("offset 0: not a moestream eval reference (bad magic)");
    if (std::fread(hdr, 4, 4, f_) != 4 || std::fread(&th, 8, 1, f_) != 1 ||
        std::fread(&mb, 8, 1, f_) != 1)
        return err("offset 8: truncated header");
    if (hdr[0] != kVersion) return err("offset 8: unsupported version " + std::to_string(hdr[0]));
    if (hdr[1] != uint32_t(n_vocab))
        return err("offset 12: vocabulary of " + std::to_string(hdr[1]) +
                   " tokens, the model has " + std::to_string(n_vocab));
    if (hdr[2] != n_pos)
        return err("offset 16: " + std::to_string(hdr[2]) + " positions, this text scores " +
                   std::to_string(n_pos) + " (another text or --max-tokens?)");
    auto window_str = [](uint32_t w) {
        return w ? "--window " + std::to_string(w) : std::string("no --window");
    };
    if (hdr[3] != window)
        return err("offset 20: recorded with " + window_str(hdr[3]) + ", this run uses " +
                   window_str(window));
    if (th != tokens_hash) return err("offset 24: recorded for other text (token hash differs)");
    if (mb != model_bytes)
        return err("offset 32: recorded with a model file of " + std::to_string(mb) +
                   " bytes, this one has " + std::to_string(model_bytes));
    // The size must be exact: a truncated or padded file is refused before any scoring.
    const uint64_t rec = 4 + 4 * uint64_t(n_vocab);
    const uint64_t want = kHeaderBytes + rec * n_pos;
    if (std::fseek(f_, 0, SEEK_END) != 0) return err("cannot seek");
    const long have = std::ftell(f_);
    if (have < 0 || uint64_t(have) != want)
        return err("size " + std::to_string(have) + " bytes, expected " + std::to_string(want) +
                   " (truncated?)");
    if (std::fseek(f_, long(kHeaderBytes), SEEK_SET) != 0) return err("cannot seek");
    return Status::Ok();
}

Status RefLogitsFile::read(int32_t next, std::vector<float> * logits) {
    if (!f_ || writing_ || done_ >= n_pos_) return Status::Runtime(path_ + ": internal: read");
    const uint64_t at = kHeaderBytes + uint64_t(done_) * (4 + 4 * uint64_t(n_vocab_));
    int32_t t = 0;
    logits->resize(size_t(n_vocab_));
    if (std::fread(&t, 4, 1, f_) != 1 ||
        std::fread(logits->data(), sizeof(float), size_t(n_vocab_), f_) != size_t(n_vocab_))
        return err("offset " + std::to_string(at) + ": truncated record");
    if (t != next)
        return err("offset " + std::to_string(at) + ": position " + std::to_string(done_) +
                   " predicts token " + std::to_string(t) + ", the text has " +
                   std::to_string(next));
    // A model's logits are finite: inf or NaN here is a damaged file, and would make every
    // statistic inf or NaN.
    for (int v = 0; v < n_vocab_; ++v)
        if (!std::isfinite((*logits)[size_t(v)]))
            return err("offset " + std::to_string(at + 4 + 4 * uint64_t(v)) + ": the logit of token " +
                       std::to_string(v) + " at position " + std::to_string(done_) +
                       " is not finite (" + std::to_string((*logits)[size_t(v)]) + ")");
    ++done_;
    return Status::Ok();
}

}  // namespace moestream
