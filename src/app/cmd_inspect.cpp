// deltaq inspect DIR: architecture, sizes and every tensor of a model folder.
#include <fmt/format.h>

#include <cstdio>

#include "app/cli_common.h"
#include "format/checkpoint.h"

namespace dq::app {

namespace {

std::string human(double bytes) {
  const char* u[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (bytes >= 1000 && i < 4) bytes /= 1000, ++i;
  return fmt::format("{:.{}f} {}", bytes, i ? 2 : 0, u[i]);
}

std::string quant_of(const Checkpoint& ck, const TensorInfo* t) {
  std::string n = t->name;
  auto strip = [&](const std::string& suf) {
    return n.size() > suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0
               ? n.substr(0, n.size() - suf.size())
               : std::string();
  };
  std::string module = strip(".weight");
  if (module.empty()) module = strip(".scales");
  if (module.empty()) module = strip(".biases");
  if (module.empty() || !ck.find(module + ".scales")) return "-";
  const TensorInfo* w = ck.find(module + ".weight");
  const TensorInfo* s = ck.find(module + ".scales");
  if (!w || w->shape.size() != 2 || s->shape.size() != 2) return "?";
  // Logical input size from the group count and the config's group size is not needed: bits/gs
  // follow from the shapes as the loader derives them.
  for (const auto* r : {&ck.refs().embed, &ck.refs().head}) {
    if (r->module == module) return fmt::format("affine {}-bit g{}", r->bits, r->group_size);
  }
  for (const LayerRefs& l : ck.refs().layers)
    for (const LinearRef* r : {&l.qkv, &l.z, &l.b, &l.a, &l.out, &l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      if (r->module == module) return fmt::format("affine {}-bit g{}", r->bits, r->group_size);
  return "affine";
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "architecture, sizes and every tensor of a model folder");
  auto dir = std::make_shared<std::string>();
  auto tensors = std::make_shared<bool>(true);
  cmd->add_option("DIR", *dir, "model folder")->required();
  cmd->add_flag("!--no-tensors", *tensors, "print only the summary");
  return {cmd, [dir, tensors]() {
            Checkpoint ck = Checkpoint::open(*dir);
            const ModelConfig& c = ck.config();
            const ModelRefs& r = ck.refs();
            std::printf("model folder   %s\n", ck.dir().c_str());
            std::printf("architecture   %s, %d layers (%d Gated DeltaNet + %d gated attention)\n", c.model_type.c_str(),
                        c.num_layers, c.n_linear(), c.n_full());
            std::string pattern;
            for (LayerKind k : c.layers) pattern += k == LayerKind::Linear ? 'L' : 'F';
            std::printf("layer pattern  %s\n", pattern.c_str());
            std::string emb = r.embed.quantized ? fmt::format("affine {}-bit, group {}", r.embed.bits, r.embed.group_size)
                                                : std::string(dtype_name(r.embed.weight->dtype));
            std::printf("layout         %s (%s), %s\n", ck.layout() == Layout::MLX ? "MLX" : "HF", ck.prefix().c_str(),
                        emb.c_str());
            std::printf("hidden         %d, MLP %d, vocab %d, head %s\n", c.hidden_size, c.intermediate_size,
                        c.vocab_size, r.tied ? "tied to the embedding" : "separate lm_head");
            std::printf("attention      %d query heads, %d KV heads, head dim %d, rotary %d dims, theta %.0f\n",
                        c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim, c.rope_theta);
            std::printf("delta net      %d key heads x %d, %d value heads x %d, conv %d (conv channels %d)\n",
                        c.lin_k_heads, c.lin_k_dim, c.lin_v_heads, c.lin_v_dim, c.conv_kernel, c.conv_dim());
            std::printf("max positions  %d, rms eps %g, eos %s\n", c.max_position, double(c.rms_eps),
                        join_ids(std::vector<int32_t>(c.eos_ids.begin(), c.eos_ids.end())).c_str());
            size_t total = 0, used = 0;
            auto all = ck.all_tensors();
            for (auto& [t, u] : all) {
              total += t->nbytes;
              if (u) used += t->nbytes;
            }
            std::printf("tensors        %zu in %zu file(s), %s (%s used by the text model)\n", all.size(),
                        ck.files().size(), human(double(total)).c_str(), human(double(used)).c_str());
            if (*tensors) {
              std::printf("\n%-70s %-5s %-16s %-18s %12s\n", "tensor", "dtype", "shape", "quantization", "bytes");
              for (auto& [t, u] : all)
                std::printf("%-70s %-5s %-16s %-18s %12zu%s\n", t->name.c_str(), dtype_name(t->dtype).data(),
                            t->shape_str().c_str(), quant_of(ck, t).c_str(), t->nbytes, u ? "" : "  (unused)");
            }
            return 0;
          }};
}

}  // namespace dq::app
