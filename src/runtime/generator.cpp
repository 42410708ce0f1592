#include "runtime/generator.h"
