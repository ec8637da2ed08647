// web_assets.h — the web page of `moestream serve` (tools/server/web/*), compiled into the
// binary by cmake/embed-files.cmake so the server needs no files at run time and no CDN.
// Thread-safety: immutable after static initialization.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace moestream::server {

struct WebAsset {
    std::string path;  // URL path: "/" + file name ("/index.html" is also served at "/")
    const unsigned char * data;
    size_t size;
    const char * content_type;
};

const std::vector<WebAsset> & web_assets();

}  // namespace moestream::server
