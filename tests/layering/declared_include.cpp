// Compiled against moestream_residency, which declares the model stage: the same include
// compiles (the positive control of layering_refuses_undeclared_include).
#include "model_loader.h"
#include "residency.h"
int main() { return 0; }
