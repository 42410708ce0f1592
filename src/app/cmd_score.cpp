// deltaq score: teacher-forced logits of a list of token ids, written as safetensors.
#include <cstdio>

#include "app/cli_common.h"
#include "format/safetensors.h"

namespace dq::app {

Command add_score(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "teacher-forced logits of token ids -> safetensors (tensor 'logits' [n, vocab])");
  auto f = std::make_shared<EngineFlags>();
  auto ids = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  f->add(cmd);
  cmd->add_option("--ids", *ids, "comma-separated token ids, e.g. 5,17,42")->required();
  cmd->add_option("--out", *out, "output .safetensors file")->required();
  return {cmd, [f, ids, out]() {
            std::vector<int32_t> v = parse_ids(*ids);
            auto e = Engine::open(f->model, f->options());
            std::vector<float> logits = e->score(v);
            const int64_t V = e->config().vocab_size;
            write_safetensors(*out, {{"logits", DType::F32, {int64_t(v.size()), V}, logits.data(), logits.size() * 4}},
                              {{"model", f->model}, {"ids", join_ids(v)}, {"backend", e->backend().name()}});
            std::fprintf(stderr, "wrote %s: logits [%zu, %lld] (%s)\n", out->c_str(), v.size(), (long long)V,
                         e->backend().name().c_str());
            return 0;
          }};
}

}  // namespace dq::app
