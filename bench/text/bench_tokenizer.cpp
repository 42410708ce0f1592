// Tokenizer benchmark: tokenizer.json load time and single-thread encode / decode throughput
// on a deterministic mixed-language corpus (corpus.h).
//
//   bench_tokenizer [--tokenizer PATH] [--mb 10] [--seed 1] [--reps 3]
//                   [--write-corpus PATH] [--write-ids PATH]
//
// --write-corpus writes the corpus (and PATH.docs, the document offsets) for
// hf_tokenizers_bench.py; --write-ids writes the whole-corpus ids as little-endian int32, the
// format of its --ids-out, so `cmp` checks that both produce the same ids.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "corpus.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

uint64_t fnv1a(const std::vector<dq::text::TokenId>& ids, uint64_t h = 0xcbf29ce484222325ull) {
  for (dq::text::TokenId id : ids) {
    auto v = uint32_t(id);
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), std::streamsize(n));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = DQ_QWEN3_TOKENIZER, corpus_out, ids_out;
  size_t mb = 10, reps = 3;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer") tok_path = value();
    else if (a == "--mb") mb = std::stoul(value());
    else if (a == "--seed") seed = std::stoull(value());
    else if (a == "--reps") reps = std::max<size_t>(1, std::stoul(value()));
    else if (a == "--write-corpus") corpus_out = value();
    else if (a == "--write-ids") ids_out = value();
    else {
      std::fprintf(stderr, "usage: %s [--tokenizer PATH] [--mb N] [--seed S] [--reps R] "
                   "[--write-corpus PATH] [--write-ids PATH]\n", argv[0]);
      return 2;
    }
  }

  auto docs = dq::bench::make_documents(mb << 20, seed);
  std::string corpus = dq::bench::join_documents(docs);
  double mbytes = double(corpus.size()) / 1e6;
  std::printf("corpus: %zu bytes (%.2f MB), %zu documents, seed %llu\n", corpus.size(), mbytes,
              docs.size(), (unsigned long long)seed);
  if (!corpus_out.empty()) {
    write_file(corpus_out, corpus.data(), corpus.size());
    // PATH.docs: "<byte offset> <length>" of each document, for hf_tokenizers_bench.py.
    std::string offsets;
    size_t at = 0;
    for (const auto& d : docs) {
      offsets += std::to_string(at) + " " + std::to_string(d.size()) + "\n";
      at += d.size() + 2;
    }
    write_file(corpus_out + ".docs", offsets.data(), offsets.size());
    std::printf("wrote corpus to %s (and %s.docs)\n", corpus_out.c_str(), corpus_out.c_str());
  }

  // Load: the first load (page cache may be cold) and the best of 5.
  auto t0 = Clock::now();
  auto tok = std::make_unique<dq::text::Tokenizer>(dq::text::Tokenizer::load(tok_path));
  double first_load = ms_since(t0), best_load = first_load;
  for (int k = 0; k < 5; ++k) {
    t0 = Clock::now();
    auto again = dq::text::Tokenizer::load(tok_path);
    best_load = std::min(best_load, ms_since(t0));
  }
  std::printf("load %s: first %.1f ms, best of 5 %.1f ms (vocab %zu, merges %zu)\n", tok_path.c_str(),
              first_load, best_load, tok->vocab_size(), tok->merge_count());

  // Whole corpus as one string. The first pass starts with an empty piece cache.
  std::vector<dq::text::TokenId> ids;
  for (size_t r = 0; r < reps; ++r) {
    t0 = Clock::now();
    ids = tok->encode(corpus);
    double ms = ms_since(t0);
    std::printf("encode whole corpus, pass %zu%s: %.1f ms, %.2f MB/s, %zu tokens\n", r + 1,
                r == 0 ? " (cold cache)" : "", ms, mbytes / (ms / 1e3), ids.size());
  }
  std::printf("ids fnv1a: %016llx\n", (unsigned long long)fnv1a(ids));
  if (!ids_out.empty()) write_file(ids_out, ids.data(), ids.size() * sizeof(ids[0]));

  // Document by document (the server's pattern: many short texts).
  {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t n = 0;
    t0 = Clock::now();
    for (const auto& d : docs) {
      auto di = tok->encode(d);
      n += di.size();
      h = fnv1a(di, h);
    }
    double ms = ms_since(t0);
    std::printf("encode per document: %.1f ms, %.2f MB/s, %zu tokens, fnv1a %016llx\n", ms,
                mbytes / (ms / 1e3), n, (unsigned long long)h);
  }

  // Decode.
  t0 = Clock::now();
  std::string text = tok->decode(ids);
  double ms = ms_since(t0);
  std::printf("decode: %.1f ms, %.2f MB/s of text, %zu bytes (the corpus in NFC)\n", ms,
              mbytes / (ms / 1e3), text.size());
  return 0;
}
