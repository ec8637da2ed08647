// server_util.h — small helpers of `moestream serve` (server.h) shared by its parts: clocks,
// JSON text, a request's socket and whether its peer left, the HTTP status of a Status, the
// constant-time key comparison and the server's wording of a drop-cold refusal.
// Invariants: none (pure functions, except find_request_socket, which reads /proc/self/fd).
// Thread-safety: every function may be called from any thread.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "moestream/moestream.h"

namespace moestream::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double now_s() {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
inline double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

inline std::string dump(const json & j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The field a library refusal names: its message starts with it ("top_p must be ...",
// "logit_bias: token id ..."), else "".
inline std::string field_of(const std::string & msg) {
    static const char * const kFields[] = {
        "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
        "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "ignore_eos",
        "stop", "n_predict"};
    for (const char * f : kFields) {
        const size_t n = std::strlen(f);
        if (msg.compare(0, n, f) == 0 && (msg.size() == n || msg[n] == ' ' || msg[n] == ':' ||
                                          msg[n] == '['))
            return std::string(f) == "n_predict" ? "max_tokens" : f;
    }
    return "";
}

// The connected socket of a request (httplib 0.11 does not expose it): the fd of this
// process whose local and peer ports and peer address are the request's. -1 if not found.
inline int find_request_socket(const httplib::Request & req) {
    DIR * d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    while (dirent * e = readdir(d)) {
        const int fd = std::atoi(e->d_name);
        if (fd <= 2) continue;
        sockaddr_storage a{}, b{};
        socklen_t la = sizeof a, lb = sizeof b;
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &la) != 0 ||
            getpeername(fd, reinterpret_cast<sockaddr *>(&b), &lb) != 0)
            continue;
        auto port_of = [](const sockaddr_storage & s) {
            if (s.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in &>(s).sin_port));
            if (s.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6 &>(s).sin6_port));
            return -1;
        };
        char host[INET6_ADDRSTRLEN] = {0};
        if (b.ss_family == AF_INET)
            inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(b).sin_addr, host, sizeof host);
        else if (b.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(b).sin6_addr, host, sizeof host);
        if (port_of(a) == req.local_port && port_of(b) == req.remote_port &&
            req.remote_addr == host) {
            found = fd;
            break;
        }
    }
    closedir(d);
    return found;
}

// True when the peer has closed its side of the connection (or it failed).
inline bool peer_gone(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

inline int http_status(const Status & st) {
    switch (st.code()) {
        case ErrorCode::kUsage:
        case ErrorCode::kBadInput:
            return 400;
        default:
            return 500;
    }
}

// Constant-time comparison (the key's length is not secret).
inline bool same_key(const std::string & a, const std::string & b) {
    if (a.size() != b.size()) return false;
    unsigned char d = 0;
    for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
    return d == 0;
}

inline std::string basename_of(const std::string & path) {
    size_t s = path.find_last_of('/');
    return s == std::string::npos ? path : path.substr(s + 1);
}

// A request's drop_cold_experts refused, in the server's words (its flags).
inline std::string drop_cold_refusal(DropColdBlock why) {
    switch (why) {
        case DropColdBlock::kFixedSlots:
            return "drop_cold_experts needs the LRU expert cache, and this server's budget is "
                   "held by the fixed-slot cache (start it without --lossless, or with "
                   "MOESTREAM_SLOT_CACHE=0)";
        case DropColdBlock::kMissFallback:
            return "drop_cold_experts cannot be combined with --miss-fallback";
        case DropColdBlock::kResident:
        case DropColdBlock::kCacheOff:
        case DropColdBlock::kNone:
            break;
    }
    return "drop_cold_experts needs the expert cache, which is off in this server (--cache-mb / "
           "--no-stream)";
}

}  // namespace moestream::server
