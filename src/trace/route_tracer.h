// route_tracer.h — writing a route trace while the engine runs (`run --route-trace FILE`;
// the format: include/moestream/route_trace.h, docs/route-trace.md).
//
// RouteTracer writes one through AtomicFile (moestream/atomic_file.h): a temporary file next
// to the target, renamed over it by finish(); a target that is a device, FIFO or directory is
// refused.
// Any write failure (disk full, unwritable directory) turns tracing off with one warning and
// removes the temporary file; inference is never affected. A trace never outgrows what
// read_route_trace reads (max_bytes, kTraceMaxFileBytes by default): the graph that would
// cross it is cut off, the trace ends with the graphs before it (a valid, shorter trace) and
// one warning says so.
//
// Thread-safety: driven from the llama_decode thread only (its router hook observer,
// trace_observer.h, the streamer and the engine).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moestream/atomic_file.h"
#include "moestream/route_trace.h"

namespace moestream {

class RouteTracer {
public:
    // Creates "<path>.tmp.<pid>" and writes the header. On failure logs a warning and returns
    // a tracer that is not active (every call is then a no-op).
    static std::unique_ptr<RouteTracer> open(const std::string & path, const TraceHeader & header,
                                             uint64_t max_bytes = kTraceMaxFileBytes);
    ~RouteTracer();  // removes the temporary file unless finish() renamed it

    bool active() const { return fd_ >= 0; }

    // --- engine ---
    // Before every llama_decode: its phase, the position of its first token, its tokens;
    // prompt_end: a prefill that ends the prompt.
    void begin_graph(bool decode, uint32_t pos0, uint32_t n_tokens, bool prompt_end = false);
    void end_graph() { close_record(); }
    // Writes the end marker, closes and renames the file over the target. Warns on failure.
    void finish();

    // --- router hook ---
    // A layer's routing (ids row-major [n_rows][k], as routed). Opens a new record.
    void routing_start(uint32_t layer, int k, int n_rows, const int32_t * ids);
    // The layer whose record still waits for its final weights, or -1.
    int64_t waiting_layer() const { return open_ && !have_weights_ ? int64_t(cur_.layer) : -1; }
    // Sets the final weight of (row, slot) of the open record; done_weights() ends the wait.
    void set_weight(int row, int slot, float w) {
        weight_[size_t(row) * cur_.k + size_t(slot)] = w;
    }
    void done_weights() { have_weights_ = true; }
    // --route-trace-scores: whether decode records carry router scores (the header's flag).
    bool wants_scores() const { return fd_ >= 0 && scores_ && decode_; }
    // The router's order (n ids per row, row stride order_row in elements) and scores by
    // expert id (row stride score_row) of `layer`'s decode rows, before any substitution;
    // kept for the record routing_start(layer) opens next.
    void stash_scores(uint32_t layer, int n_rows, int n, const int32_t * order,
                      int64_t order_row, const float * scores, int64_t score_row);
    void mark_substituted(int row, int slot) {
        flags_[size_t(row) * cur_.k + size_t(slot)] |= kSlotSubstituted;
    }
    void mark_fallback(int row, int slot) {
        flags_[size_t(row) * cur_.k + size_t(slot)] |= kSlotFallback;
    }
    void mark_dropped(int row, int slot) {
        flags_[size_t(row) * cur_.k + size_t(slot)] |= kSlotDropped;
    }

    // --- streamer ---
    // The distinct experts staged for `layer`, whether each was resident before the stage,
    // and the bytes read for them.
    void on_stage(uint32_t layer, const std::vector<uint32_t> & experts,
                  const std::vector<uint8_t> & resident, uint64_t bytes_read);

    // A read-ahead call into the store (its prefetch() called the ledger) while the open
    // record's layer is staged: the graph layer it read ahead, the guess it was given (in
    // order) and the experts the ledger committed of it, shared: into the shared slots of a store with fixed slots,
    // one_token: the guess was at most k experts (it may evict). The record is written when
    // on_read_ahead_end() says whether its reads succeeded (at once when nothing was committed:
    // nothing is read, so nothing ends).
    void on_read_ahead(uint32_t layer, const std::vector<uint32_t> & guess,
                       const std::vector<uint32_t> & committed, bool shared, bool one_token);
    void on_read_ahead_end(bool ok);

    uint64_t records() const { return n_records_; }
    bool full() const { return full_; }  // stopped at max_bytes (the file holds what fitted)

private:
    RouteTracer() = default;
    void close_record();
    void flush(bool force);
    void fail(const std::string & what, int err);
    void stop_full();  // ends the trace at the last whole graph (max_bytes reached)

    std::string path_;
    AtomicFile file_;  // the trace goes to its temporary file, renamed over path_ by finish()
    int fd_ = -1;      // file_.fd() while tracing, -1 once off
    std::string buf_;
    uint64_t n_records_ = 0, n_slots_ = 0;
    uint64_t max_bytes_ = kTraceMaxFileBytes;  // the file's size limit, end marker included
    uint64_t written_ = 0;                     // bytes written to the file so far
    // Where the current graph's records start (file offset, records and slots before it).
    uint64_t graph_at_ = 0, graph_records_ = 0, graph_slots_ = 0;
    bool full_ = false;
    uint32_t n_expert_ = 0;

    // graph
    bool decode_ = false;
    bool prompt_end_ = false;
    uint32_t pos0_ = 0, n_tokens_ = 0, graph_ = 0;
    bool graph_started_ = false;

    // the open record
    bool open_ = false, have_weights_ = false;
    TraceRouting cur_;
    std::vector<int32_t> ids_;
    std::vector<float> weight_;
    std::vector<uint8_t> flags_;
    std::vector<uint8_t> resident_;  // per expert id, scratch

    // The read-ahead call whose reads are outstanding (on_read_ahead), and the read-ahead
    // records written while a routing record is open (they follow it in the file).
    bool ra_open_ = false;
    uint8_t ra_flags_ = 0;
    uint32_t ra_routing_ = 0, ra_layer_ = 0;
    std::vector<uint32_t> ra_experts_;  // the guess, kReadAheadCommitted on committed ones
    std::string ra_buf_;
    void put_read_ahead(bool ok);

    // --route-trace-scores
    bool scores_ = false;
    int64_t stash_layer_ = -1;  // the layer the stashed scores belong to, -1: none
    std::vector<uint16_t> stash_order_;
    std::vector<float> stash_scores_;
    uint32_t score_rows_ = 0;  // of the open record
    std::vector<uint16_t> order_;
    std::vector<float> scores_row_;
};

}  // namespace moestream
