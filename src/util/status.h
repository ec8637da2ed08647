// status.h — forwards to the public error type (include/moestream/status.h).
#pragma once
#include "moestream/status.h"
