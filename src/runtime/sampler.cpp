#include "runtime/sampler.h"
