// Compiled against moestream_util alone, which does not declare the model stage as a
// dependency: the include below must not be found (tests/CMakeLists.txt,
// layering_refuses_undeclared_include).
#include "model_loader.h"
#include "moestream/log.h"
int main() { return 0; }
