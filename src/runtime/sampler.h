// Placeholder: the sampler (temperature, top-k/p, min-p, penalties, seeds). Being written.
#pragma once
