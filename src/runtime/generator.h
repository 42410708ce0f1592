// Placeholder: text generation on an Engine (streaming, stop strings, eos). Being written.
#pragma once
