// Broken, truncated and lying model folders: each gets one clear error naming the file and the
// tensor or field, with expected vs actual, from the API and from the command line (exit 1).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "format/checkpoint.h"

using namespace dq;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = std::string(DQ_TEST_DATA) + "/tiny-q4";
const std::string kHf = std::string(DQ_TEST_DATA) + "/tiny-hf16";

struct Image {  // a safetensors file as header JSON + data buffer
  json header;
  std::vector<uint8_t> data;
};

Image read_image(const std::string& path) {
  auto f = MappedFile::open(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->data()[i];
  Image im;
  im.header = json::parse(f->data() + 8, f->data() + 8 + n);
  im.data.assign(f->data() + 8 + n, f->data() + f->size());
  return im;
}

void write_image(const std::string& path, const Image& im, size_t truncate_to = SIZE_MAX) {
  std::string h = im.header.dump();
  std::vector<uint8_t> out(8);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(n >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), im.data.begin(), im.data.end());
  if (truncate_to < out.size()) out.resize(truncate_to);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), long(out.size()));
}

// A fresh copy of a fixture folder, then `edit` breaks it.
std::string broken(const std::string& name, const std::string& src, const std::function<void(const std::string&)>& edit) {
  std::string dir = std::string(::testing::TempDir()) + "/bad-" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    fs::copy_file(src + "/" + f, dir + "/" + f);
  edit(dir);
  return dir;
}

void edit_header(const std::string& dir, const std::function<void(json&)>& fn) {
  Image im = read_image(dir + "/model.safetensors");
  fn(im.header);
  write_image(dir + "/model.safetensors", im);
}

void edit_config(const std::string& dir, const std::function<void(json&)>& fn) {
  json c = json::parse(read_text_file(dir + "/config.json"));
  fn(c);
  std::ofstream(dir + "/config.json") << c.dump(2);
}

std::string open_error(const std::string& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs the CLI; returns the exit code and stderr.
int run_cli(const std::string& args, std::string* err) {
  std::string cmd = std::string(DQ_BUILD_DIR) + "/deltaq " + args + " 2>&1 >/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  err->clear();
  while (size_t n = fread(buf, 1, sizeof buf, p)) err->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void expect_clear_error(const std::string& dir, std::vector<std::string> parts) {
  std::string msg = open_error(dir);
  ASSERT_FALSE(msg.empty()) << dir << " opened without error";
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  std::string err;
  int code = run_cli("inspect " + dir, &err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one line expected: " << err;
  EXPECT_NE(err.find("deltaq inspect: error: "), std::string::npos) << err;
}

}  // namespace

TEST(BadCheckpoints, TheFixturesOpen) {
  EXPECT_EQ(open_error(kSrc), "");
  EXPECT_EQ(open_error(kHf), "");
}

TEST(BadCheckpoints, TruncatedFile) {
  auto d = broken("trunc", kSrc, [](const std::string& d) {
    write_image(d + "/model.safetensors", read_image(d + "/model.safetensors"), 20000);
  });
  expect_clear_error(d, {"model.safetensors", "tensor '", "data_offsets", "truncated"});
}

TEST(BadCheckpoints, HeaderLengthPastTheEnd) {
  auto d = broken("hlen", kSrc, [](const std::string& d) {
    std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
  });
  expect_clear_error(d, {"model.safetensors", "header length", "exceeds the limit"});
}

TEST(BadCheckpoints, OverlappingAndOutOfRangeOffsets) {
  auto d = broken("overlap", kSrc, [](const std::string& d) {
    edit_header(d, [](json& h) {
      auto& a = h["language_model.model.norm.weight"]["data_offsets"];
      auto& b = h["language_model.model.embed_tokens.scales"]["data_offsets"];
      b = {a[0].get<uint64_t>(), a[0].get<uint64_t>() + (b[1].get<uint64_t>() - b[0].get<uint64_t>())};
    });
  });
  expect_clear_error(d, {"model.safetensors", "overlap"});
  auto d2 = broken("range", kSrc, [](const std::string& d) {
    edit_header(d, [](json& h) { h["language_model.model.norm.weight"]["data_offsets"] = {10000000, 10000256}; });
  });
  expect_clear_error(d2, {"model.safetensors", "'language_model.model.norm.weight'", "[10000000, 10000256]"});
}

TEST(BadCheckpoints, ShapeContradictsTheConfig) {
  auto d = broken("shape", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) { c["text_config"]["intermediate_size"] = 512; });
  });
  expect_clear_error(d, {"model.safetensors", "mlp.gate_proj.weight", "[512, 128", "got [384, 16]"});
  auto d2 = broken("shape-hf", kHf, [](const std::string& d) {
    edit_config(d, [](json& c) { c["text_config"]["vocab_size"] = 1000; });
  });
  expect_clear_error(d2, {"model.safetensors", "embed_tokens.weight", "expected shape [1000, 128]", "got [1024, 128]"});
}

TEST(BadCheckpoints, DtypeContradictsTheLayout) {
  auto d = broken("dtype", kSrc, [](const std::string& d) {
    edit_header(d, [](json& h) {
      auto& t = h["language_model.model.layers.0.mlp.up_proj.weight"];
      t["dtype"] = "I32";
    });
  });
  expect_clear_error(d, {"mlp.up_proj.weight", "must be U32", "got I32"});
  auto d2 = broken("dtype-norm", kSrc, [](const std::string& d) {
    edit_header(d, [](json& h) {
      auto& t = h["language_model.model.norm.weight"];
      t["dtype"] = "I16";
    });
  });
  expect_clear_error(d2, {"norm.weight", "expected BF16, F16 or F32", "got I16"});
}

TEST(BadCheckpoints, MissingTensor) {
  auto d = broken("missing", kSrc, [](const std::string& d) {
    edit_header(d, [](json& h) { h.erase("language_model.model.layers.3.self_attn.k_norm.weight"); });
    json idx = json::parse(read_text_file(d + "/model.safetensors.index.json"));
    idx["weight_map"].erase("language_model.model.layers.3.self_attn.k_norm.weight");
    std::ofstream(d + "/model.safetensors.index.json") << idx.dump();
  });
  expect_clear_error(d, {"missing tensor 'language_model.model.layers.3.self_attn.k_norm.weight'", "layer 3"});
}

TEST(BadCheckpoints, WrongGroupSizeAndBits) {
  auto d = broken("gs", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) { c["quantization"]["group_size"] = 32; });
  });
  expect_clear_error(d, {".scales", "group size 64", "group_size = 32"});
  auto d2 = broken("bits", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) { c["quantization"]["bits"] = 8; });
  });
  expect_clear_error(d2, {"4-bit values", "bits = 8"});
  auto d3 = broken("noquant", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) {
      c.erase("quantization");
      c.erase("quantization_config");
    });
  });
  expect_clear_error(d3, {"is quantized", "no \"quantization\" block"});
}

// A layer whose gate and up are quantized differently (a per-module override gives up_proj
// group 32, its scales and biases reshaped to match): SwiGLU runs gate and up against one
// prepared x and one set of group sums, so opening it is a clear error, not a wrong answer.
TEST(BadCheckpoints, GateAndUpStoredDifferently) {
  auto d = broken("gate-up", kSrc, [](const std::string& d) {
    Image im = read_image(d + "/model.safetensors");
    for (const char* part : {"scales", "biases"}) {
      json& t = im.header[std::string("language_model.model.layers.0.mlp.up_proj.") + part];
      const int64_t rows = t["shape"][0], groups = t["shape"][1];
      t["shape"] = {rows, 2 * groups};
      const size_t at = im.data.size();
      im.data.resize(at + size_t(rows * 2 * groups) * 2, 0x3C);  // bf16 0x3C3C: a small positive scale
      t["data_offsets"] = {at, im.data.size()};
    }
    write_image(d + "/model.safetensors", im);
    edit_config(d, [](json& c) {
      c["quantization"]["language_model.model.layers.0.mlp.up_proj"] = {{"group_size", 32}, {"bits", 4}};
    });
  });
  expect_clear_error(d, {"layer 0: mlp.gate_proj and mlp.up_proj must be stored alike"});
}

TEST(BadCheckpoints, MalformedOrIncompleteConfig) {
  auto d = broken("cfg-json", kSrc, [](const std::string& d) { std::ofstream(d + "/config.json") << "{\"text_config\": {"; });
  expect_clear_error(d, {"config.json", "not valid JSON"});
  auto d2 = broken("cfg-missing", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) { c["text_config"].erase("num_attention_heads"); });
  });
  expect_clear_error(d2, {"config.json", "text_config.num_attention_heads: missing"});
  auto d3 = broken("cfg-type", kSrc, [](const std::string& d) {
    edit_config(d, [](json& c) { c["text_config"]["linear_num_value_heads"] = "four"; });
  });
  expect_clear_error(d3, {"config.json", "linear_num_value_heads: expected an integer, got \"four\""});
}

TEST(BadCheckpoints, NotAModelFolder) {
  std::string empty = std::string(::testing::TempDir()) + "/empty-dir";
  fs::create_directories(empty);
  expect_clear_error(empty, {empty, "not a model folder: no config.json"});
  expect_clear_error(kSrc + "/config.json", {"not a directory"});
  expect_clear_error("/nonexistent/model", {"/nonexistent/model", "not a directory"});
}

TEST(BadCheckpoints, LyingIndex) {
  auto d = broken("index", kSrc, [](const std::string& d) {
    json idx = json::parse(read_text_file(d + "/model.safetensors.index.json"));
    idx["weight_map"]["language_model.model.norm.weight"] = "model-00002-of-00002.safetensors";
    std::ofstream(d + "/model.safetensors.index.json") << idx.dump();
  });
  expect_clear_error(d, {"model-00002-of-00002.safetensors", "does not exist"});
  auto d2 = broken("index-escape", kSrc, [](const std::string& d) {
    json idx = json::parse(read_text_file(d + "/model.safetensors.index.json"));
    idx["weight_map"]["language_model.model.norm.weight"] = "../../etc/passwd";
    std::ofstream(d + "/model.safetensors.index.json") << idx.dump();
  });
  expect_clear_error(d2, {"model.safetensors.index.json", "not a file name inside the model folder"});
  auto d3 = broken("index-json", kSrc, [](const std::string& d) {
    std::ofstream(d + "/model.safetensors.index.json") << "[]";
  });
  expect_clear_error(d3, {"model.safetensors.index.json", "weight_map"});
}

TEST(Cli, UsageErrorsExitTwo) {
  std::string err;
  EXPECT_EQ(run_cli("", &err), 2) << err;
  EXPECT_EQ(run_cli("score -m " + kSrc + " --ids 1 --out x --bogus", &err), 2) << err;
  EXPECT_NE(err.find("bogus"), std::string::npos) << err;
  EXPECT_EQ(run_cli("score -m", &err), 2) << err;
  EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1,2 -n notanumber", &err), 2) << err;
  EXPECT_EQ(run_cli("nosuchcommand", &err), 2) << err;
  for (const char* c : {"", "demo", "run", "score", "inspect", "bench", "make-model", "chat", "tokenize", "template",
                        "perplexity"})
    EXPECT_EQ(run_cli(std::string(c) + " --help", &err), 0) << c << ": " << err;
}

TEST(Cli, BadIdsAndBadValuesExitOne) {
  std::string err;
  EXPECT_EQ(run_cli("score -m " + kSrc + " --ids 1,x,3 --out /tmp/x.safetensors", &err), 1) << err;
  EXPECT_NE(err.find("entry 2 is \"x\""), std::string::npos) << err;
  EXPECT_EQ(run_cli("score -m " + kSrc + " --ids 1,5000 --out /tmp/x.safetensors", &err), 1) << err;
  EXPECT_NE(err.find("token id 5000 (position 1) is out of range [0, 1024)"), std::string::npos) << err;
  EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1 -n 10 --ctx 4", &err), 1) << err;
  EXPECT_NE(err.find("context is full"), std::string::npos) << err;
}

// --device: cpu, cuda or cuda:N; anything else is a usage error naming the value. A CUDA
// device this machine lacks (CI has no GPU; a GPU machine has no device 7) is a clear error.
TEST(Cli, DeviceValues) {
  std::string err;
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:1024", "cuda:0x1", "cuda:99999"}) {
    EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1 -n 1 --device " + bad, &err), 2) << bad << ": " << err;
    EXPECT_NE(err.find(std::string("'") + bad + "'"), std::string::npos) << bad << ": " << err;
    EXPECT_NE(err.find("cuda:N"), std::string::npos) << bad << ": " << err;
  }
  EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1 -n 1 --device cuda:7", &err), 1) << err;
  EXPECT_NE(err.find("--device cuda:7: "), std::string::npos) << err;
  EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1 -n 1 --device cpu", &err), 0) << err;
}

// --prefill-chunk: out of range or not a number is a usage error naming the option; any chunk
// gives the same logits (prefill in chunks equals token by token), 0 (the backend's) too.
TEST(Cli, PrefillChunk) {
  std::string err;
  for (const char* bad : {"-3", "x", "65537", "1.5"}) {
    EXPECT_EQ(run_cli("run -m " + kSrc + " --ids 1 -n 1 --prefill-chunk " + bad, &err), 2) << bad << ": " << err;
    EXPECT_NE(err.find("--prefill-chunk"), std::string::npos) << bad << ": " << err;
  }
  auto hash = [](const std::string& chunk) {
    const std::string cmd = std::string(DQ_BUILD_DIR) + "/deltaq run -m " + kSrc +
                            " --ids 5,17,42,7,99,3,250,8,11 -n 4 --hash-logits --prefill-chunk " + chunk + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    pclose(p);
    const size_t at = out.find("logits hash ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string one = hash("1");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(hash("4"), one);
  EXPECT_EQ(hash("64"), one);
  EXPECT_EQ(hash("0"), one);
}

TEST(Cli, TextCommands) {
  const std::string demo = std::string(DQ_SOURCE_DIR) + "/models/demo-fortunes/mlx-4bit";
  std::string out;
  // stdout this time
  FILE* p = popen((std::string(DQ_BUILD_DIR) + "/deltaq tokenize -m " + demo +
                   " 'The best way to predict the future is'").c_str(), "r");
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0);
  EXPECT_EQ(out, "[318,1034,708,282,725,67,736,263,1965,300]\n");
  std::string err;
  EXPECT_EQ(run_cli("chat -m " + demo + " </dev/null", &err), 1) << err;
  EXPECT_NE(err.find("has no chat template"), std::string::npos) << err;
  EXPECT_EQ(run_cli("tokenize -m " + kSrc + " hello", &err), 1) << err;  // no tokenizer.json there
  EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;
  EXPECT_EQ(run_cli("run -m " + demo + " -p hi --temp -1", &err), 2) << err;
  EXPECT_EQ(run_cli("run -m " + demo + " -p hi --ids 1", &err), 2) << err;  // one or the other
  EXPECT_EQ(run_cli("template -m " + demo + " --messages /nonexistent.json", &err), 1) << err;
}
