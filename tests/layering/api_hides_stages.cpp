// Compiled as the CLI and the server are, against moestream_api alone: the public headers are
// found, a stage's internal header is not (layering_api_hides_stages).
#include "moestream/moestream.h"
#include "residency.h"
int main() { return 0; }
