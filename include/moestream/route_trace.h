// route_trace.h — route traces (`moestream run --route-trace FILE`, docs/route-trace.md).
//
// A trace records every MoE layer's routing of every graph the engine ran: phase (prefill or
// decode), token position, layer, and per routed slot (rank order) the expert id, its final
// router weight, whether it was resident when the layer was staged (hit) and whether
// --drop-cold-experts dropped it; per routing the bytes the streamer read; and (version 8)
// every read-ahead call into the store: the layer read ahead, its guess with the experts the
// store committed marked, whether their reads succeeded. The header carries
// the format version and the model's shape (layers, experts, k, slice bytes per projection,
// page size, cache budget, settings), so `moestream replay` (replay.h) can re-run the
// residency cache offline with the engine's own accounting.
//
// The engine's RouteTracer (src/trace/route_tracer.h) writes one, through AtomicFile
// (atomic_file.h). read_route_trace() parses and validates one; every error names the byte
// offset (Status kBadInput). It reads regular files only (a FIFO, device or directory is
// refused without blocking), checks the magic before reading the rest, and refuses files
// above kTraceMaxFileBytes.
//
// Thread-safety: parsed traces are plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

// Version 9: on the fixed slots, a routing wider than the slots flags as hits what the shared
// slots it is read into hold (their read-ahead); version 8 flagged the experts holding a slot.
constexpr uint32_t kRouteTraceVersion = 9;  // this build writes 9, reads 1 to 9
constexpr char kRouteTraceMagic[8] = {'M', 'S', 'R', 'T', 'R', 'A', 'C', 'E'};

// What a trace's shape may be (a real model's, with room): read_route_trace and
// parse_route_trace refuse anything larger, so replay never sizes arrays from a hostile header.
constexpr uint32_t kTraceMaxLayers = 512;                // llama.cpp's LLAMA_MAX_LAYERS
constexpr uint32_t kTraceMaxExperts = 4096;              // per MoE layer (released: <= 512)
constexpr uint64_t kTraceMaxLayerExperts = 1u << 20;     // MoE layers x experts
constexpr uint64_t kTraceMaxFileBytes = 1ull << 30;      // read_route_trace reads at most this

// Per-slot flags (the top 8 bits of a slot's 32-bit word; the low 24 bits are the expert id).
enum : uint8_t {
    kSlotResident = 1,  // the expert was resident when the layer was staged (a hit)
    kSlotDropped = 2,   // --drop-cold-experts dropped it (never looked up, never read)
    // --substitute-experts replaced the routed expert by the resident one whose id the slot
    // holds (version 4; always with kSlotResident: a substitute was resident when chosen).
    kSlotSubstituted = 4,
    // --miss-fallback computed the slot's expert from its low-bit copy (version 5; never with
    // kSlotDropped or kSlotSubstituted). With kSlotResident: a hit on a lossy copy.
    kSlotFallback = 8,
};
constexpr uint8_t kSlotKnownFlags =
    kSlotResident | kSlotDropped | kSlotSubstituted | kSlotFallback;

// Read-ahead record flags (version 8).
enum : uint8_t {
    kReadAheadOk = 1,        // its reads all succeeded (the experts became resident)
    kReadAheadShared = 2,    // into the shared slots of the fixed-slot cache (a wide guess)
    kReadAheadOneToken = 4,  // the guess had at most k experts (it may evict slots)
};
constexpr uint8_t kReadAheadKnownFlags = kReadAheadOk | kReadAheadShared | kReadAheadOneToken;
// In a read-ahead record's expert words: the store committed this expert of the guess.
constexpr uint32_t kReadAheadCommitted = 1u << 31;

// One read-ahead call into the store (the streamer's prefetch(): decode --prefetch, prefill
// read-ahead), made while routing `routing`'s layer was staged, after its stage;
// its reads ended (end_prefetch) before the next routing's stage. Version 8.
struct TraceReadAhead {
    uint64_t offset = 0;   // byte offset of the record in the file
    uint32_t routing = 0;  // index into RouteTrace::routings
    uint32_t layer = 0;    // graph layer read ahead
    uint32_t moe_idx = 0;  // index into header.moe_layers (derived)
    uint8_t flags = 0;     // kReadAhead*
    // Its guess, in the order given: RouteTrace::read_ahead_experts[first, first + n), each
    // id | kReadAheadCommitted when the store committed it; committed: how many were.
    uint64_t first = 0;
    uint32_t n = 0, committed = 0;
};

struct TraceLayerShape {
    uint32_t layer = 0;                 // graph layer index il
    std::vector<uint64_t> slice_bytes;  // bytes of one expert, per projection tensor
    // Per projection tensor: where the cache placed it within its first page (the tensor's
    // file offset modulo page_bytes; page_layout.h). Version 1 traces: all zero.
    std::vector<uint64_t> phase_bytes;
    uint64_t expert_bytes = 0;          // their sum
};

struct TraceHeader {
    uint32_t version = kRouteTraceVersion;
    uint32_t n_layer = 0;             // graph layers (block_count)
    uint32_t n_expert = 0;            // experts per MoE layer
    uint32_t k_model = 0;             // the model's top-k
    uint32_t k = 0;                   // top-k of the run (--n-expert-used, else k_model)
    uint64_t page_bytes = 4096;       // the cache's commit granularity on the recording machine
    uint64_t cache_budget_bytes = 0;  // 0 = cache off
    double drop_cold = 0;             // --drop-cold-experts F, 0 = off
    bool drop_in_prefill = false;
    bool drop_renorm = false;
    // The cache recycled pool chunks (residency.h): a live expert cost whole chunks per
    // projection (PageLayout::chunk_pages) rather than its exclusive pages. Version 3.
    bool cache_chunks = false;
    // Version 6. --route-trace-scores: every decode record carries its rows' full router
    // scores and order (RouteTrace::score_order / scores), so replay can decide
    // --substitute-experts. substitute: the run's --substitute-experts M (0 = off).
    bool scores = false;
    double substitute = 0;
    // Version 7. The store that recorded the trace was the fixed-slot cache (residency.h) with
    // this many slots per MoE layer (0: the LRU cache or the cache off); slot_warm: its warm
    // start after the prompt's last ubatch was on (the engine writes true with the fixed slots;
    // replay follows the header either way).
    uint32_t slots_per_layer = 0;
    bool slot_warm = false;
    std::vector<TraceLayerShape> moe_layers;  // ascending layer
    std::string settings_json;                // the engine's resolved settings (informational)
};

// One routing record: one MoE layer of one graph (llama_decode), n_rows tokens x k slots.
struct TraceRouting {
    uint64_t offset = 0;      // byte offset of the record in the file
    uint32_t layer = 0;       // graph layer il
    uint32_t moe_idx = 0;     // index into header.moe_layers (derived)
    uint32_t n_rows = 0;      // tokens routed (prefill: the batch; last layer: outputs only)
    uint32_t pos = 0;         // position of the first row's token
    uint32_t graph = 0;       // llama_decode index since the trace began
    uint64_t bytes_read = 0;  // bytes the streamer read for it (alignment over-read included)
    uint64_t first_slot = 0;  // its slots: [first_slot, first_slot + n_rows * k)
    uint16_t k = 0;
    uint8_t decode = 0;  // 1 = decode phase, 0 = prefill
    // Prefill of the graph that ends the prompt (decode follows; GraphInfo::prompt_end).
    // Version 7 (the record's phase byte 2); 0 in older traces.
    uint8_t prompt_end = 0;
    // Rows with router scores (header.scores, decode): 0 (the engine could not read them, so
    // it did not substitute there either) or n_rows, from row first_score_row of the arrays.
    uint32_t score_rows = 0;
    uint64_t first_score_row = 0;
};

struct RouteTrace {
    TraceHeader header;
    std::vector<TraceRouting> routings;
    // Slots, row-major within a routing, rank order within a row.
    std::vector<int32_t> expert;  // the ROUTED expert id (before any drop repointing; a
                                  // kSlotSubstituted slot holds the substitute, as read)
    std::vector<float> weight;    // final router weight, NaN when it was not observed
    std::vector<uint8_t> flags;   // kSlot*
    // Router scores (header.scores), n_expert entries per scored row: the router's order of
    // all experts before any substitution (rank 0 first; its first k are the routed
    // experts) and each expert's score by expert id (the value substitute_row compares).
    std::vector<uint16_t> score_order;
    std::vector<float> scores;
    // Read-ahead calls (version 8), in call order, and their guesses.
    std::vector<TraceReadAhead> read_aheads;
    std::vector<uint32_t> read_ahead_experts;
    uint64_t file_bytes = 0;
};

// Parses and validates a trace. Errors are kBadInput and name the file and byte offset.
Status read_route_trace(const std::string & path, RouteTrace * out);
Status parse_route_trace(const uint8_t * data, uint64_t size, const std::string & name,
                         RouteTrace * out);

}  // namespace moestream
