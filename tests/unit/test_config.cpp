// config.json parsing: nested or flat text_config, derived values, and clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/model_config.h"

using namespace dq;
using json = nlohmann::json;

namespace {

json text_config() {
  return {{"model_type", "qwen3_5_text"}, {"vocab_size", 1024}, {"hidden_size", 128}, {"intermediate_size", 384},
          {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
          {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 32},
          {"linear_value_head_dim", 32}, {"linear_conv_kernel_dim", 4}, {"rms_norm_eps", 1e-6},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
          {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}}};
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelConfig, NestedTextConfig) {
  json top = {{"model_type", "qwen3_5"}, {"text_config", text_config()}, {"tie_word_embeddings", true},
              {"eos_token_id", {248046, 248044}}};
  ModelConfig c = parse_model_config(top.dump(), "config.json");
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_EQ(c.conv_dim(), 2 * 2 * 32 + 4 * 32);
  EXPECT_EQ(c.n_linear(), 3);
  EXPECT_EQ(c.n_full(), 1);
  EXPECT_EQ(c.tie_embeddings, true);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{248046, 248044}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_FALSE(c.quant.has_value());
}

TEST(ModelConfig, FlatConfigAndDerivedLayerTypes) {
  json tc = text_config();
  tc.erase("layer_types");
  tc["full_attention_interval"] = 2;
  tc["eos_token_id"] = 7;
  ModelConfig c = parse_model_config(tc.dump(), "config.json");
  ASSERT_EQ(c.layers.size(), 4u);
  EXPECT_EQ(c.layers[0], LayerKind::Linear);
  EXPECT_EQ(c.layers[1], LayerKind::Full);
  EXPECT_EQ(c.layers[3], LayerKind::Full);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{7}));
  EXPECT_FALSE(c.tie_embeddings.has_value());
  tc.erase("full_attention_interval");
  EXPECT_EQ(parse_model_config(tc.dump(), "config.json").layers[3], LayerKind::Full);  // default interval 4
}

TEST(ModelConfig, QuantizationBlockAndOverrides) {
  json top = {{"model_type", "qwen3_5"}, {"text_config", text_config()},
              {"quantization", {{"group_size", 64}, {"bits", 4}, {"mode", "affine"},
                                {"language_model.model.layers.0.mlp.gate_proj", {{"group_size", 32}, {"bits", 8}}},
                                {"language_model.model.layers.1.mlp.up_proj", false}}}};
  ModelConfig c = parse_model_config(top.dump(), "config.json");
  ASSERT_TRUE(c.quant.has_value());
  EXPECT_EQ(c.quant->group_size, 64);
  EXPECT_EQ(c.quant->bits, 4);
  EXPECT_EQ(c.quant_overrides.at("language_model.model.layers.0.mlp.gate_proj")->bits, 8);
  EXPECT_FALSE(c.quant_overrides.at("language_model.model.layers.1.mlp.up_proj").has_value());
}

TEST(ModelConfig, Errors) {
  EXPECT_NE(error_of(json::array()).find("expected a JSON object"), std::string::npos);
  try {
    parse_model_config("{not json", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
  json tc = text_config();
  tc.erase("hidden_size");
  EXPECT_NE(error_of(tc).find("hidden_size: missing"), std::string::npos) << error_of(tc);
  tc = text_config();
  tc["hidden_size"] = "big";
  EXPECT_NE(error_of(tc).find("hidden_size: expected an integer, got \"big\""), std::string::npos) << error_of(tc);
  tc = text_config();
  tc["num_hidden_layers"] = -3;
  EXPECT_NE(error_of(tc).find("num_hidden_layers: expected an integer in [1, 1024], got -3"), std::string::npos);
  tc = text_config();
  tc["layer_types"] = {"linear_attention"};
  EXPECT_NE(error_of(tc).find("layer_types: expected a list of 4 entries"), std::string::npos) << error_of(tc);
  tc = text_config();
  tc["layer_types"][2] = "mamba";
  EXPECT_NE(error_of(tc).find("layer_types[2]"), std::string::npos) << error_of(tc);
  tc = text_config();
  tc["model_type"] = "llama";
  EXPECT_NE(error_of(tc).find("model_type"), std::string::npos);
  tc = text_config();
  tc["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(tc).find("multiple of num_key_value_heads"), std::string::npos) << error_of(tc);
  tc = text_config();
  tc["attn_output_gate"] = false;
  EXPECT_NE(error_of(tc).find("attn_output_gate"), std::string::npos);
  tc = text_config();
  tc["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_NE(error_of(tc).find("rope_type"), std::string::npos);
  json top = {{"model_type", "qwen3_5"}, {"text_config", "x"}};
  EXPECT_NE(error_of(top).find("text_config: expected an object"), std::string::npos);
  top = {{"model_type", "qwen3_5"}, {"text_config", text_config()}, {"quantization", {{"group_size", 0}, {"bits", 4}}}};
  EXPECT_NE(error_of(top).find("quantization.group_size"), std::string::npos) << error_of(top);
  top = {{"model_type", "qwen3_5"}, {"text_config", text_config()}, {"quantization_config", {{"quant_method", "gptq"}}}};
  EXPECT_NE(error_of(top).find("quant_method"), std::string::npos) << error_of(top);
  top = {{"model_type", "qwen3_5"}, {"text_config", text_config()}, {"eos_token_id", "x"}};
  EXPECT_NE(error_of(top).find("eos_token_id"), std::string::npos);
}
