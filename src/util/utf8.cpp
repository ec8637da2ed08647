// utf8.cpp — see moestream/utf8.h.
#include "moestream/utf8.h"

namespace moestream {

int utf8_sequence(const std::string & s, size_t i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c == 0xE0)
        len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC)
        len = 3;
    else if (c == 0xED)
        len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF)
        len = 3;
    else if (c == 0xF0)
        len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        len = 4;
    else if (c == 0xF4)
        len = 4, hi = 0x8F;
    else
        return 0;
    for (int k = 1; k < len; ++k) {
        if (i + size_t(k) >= s.size()) return -1;
        const unsigned char b = static_cast<unsigned char>(s[i + size_t(k)]);
        const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return 0;
    }
    return len;
}

long utf8_valid_upto(const std::string & s) {
    size_t i = 0;
    while (i < s.size()) {
        const int n = utf8_sequence(s, i);
        if (n == 0) return -1;
        if (n < 0) return long(i);
        i += size_t(n);
    }
    return long(s.size());
}

}  // namespace moestream
