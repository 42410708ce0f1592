// The API layer without sockets: request validation, error objects, the <think> splitter.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/api.h"

using namespace dq::server;

namespace {

ApiError expect_error(const std::string& body, bool chat = true) {
  try {
    parse_completion_request(body, chat);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat(const std::string& extra) { return std::string("{") + kMsgs + (extra.empty() ? "" : ",") + extra + "}"; }

}  // namespace

TEST(ServerApi, ParsesAFullChatRequest) {
  auto r = parse_completion_request(
      chat(R"("model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":0.9,)"
           R"("top_k":40,"min_p":0.05,"max_tokens":12,"stop":["a","bc"],"seed":7,"presence_penalty":0.5,)"
           R"("frequency_penalty":-0.5,"repetition_penalty":1.1,"chat_template_kwargs":{"enable_thinking":false,"x":1},)"
           R"("user":"someone","unknown_field":{"deep":[1,2,3]})"),
      true);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.model, "m");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(*r.max_tokens, 12);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(*r.sampling.seed, 7u);
  EXPECT_EQ(*r.enable_thinking, false);
  EXPECT_EQ(r.template_kwargs["x"], 1);
  EXPECT_EQ(r.messages[0]["content"], "hi");
}

TEST(ServerApi, Defaults) {
  auto r = parse_completion_request(chat(""), true);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_FALSE(r.enable_thinking);
  // nulls are the defaults too
  auto n = parse_completion_request(chat(R"("temperature":null,"stop":null,"max_tokens":null,"seed":null)"), true);
  EXPECT_FLOAT_EQ(n.sampling.temperature, 1.0f);
  EXPECT_TRUE(n.stop.empty());
}

TEST(ServerApi, MessagesAreNormalized) {
  auto r = parse_completion_request(
      R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},)"
      R"({"role":"assistant","content":null},{"role":"user"}]})",
      true);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_TRUE(r.messages[1]["content"].is_null());
  EXPECT_TRUE(r.messages[2]["content"].is_null());
}

TEST(ServerApi, MaxCompletionTokensWins) {
  auto r = parse_completion_request(chat(R"("max_tokens":5,"max_completion_tokens":9)"), true);
  EXPECT_EQ(*r.max_tokens, 9);
}

TEST(ServerApi, CompletionPrompts) {
  EXPECT_EQ(*parse_completion_request(R"({"prompt":"abc"})", false).prompt_text, "abc");
  EXPECT_EQ(*parse_completion_request(R"({"prompt":["abc"]})", false).prompt_text, "abc");
  EXPECT_EQ(parse_completion_request(R"({"prompt":[1,2,3]})", false).prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request(R"({"prompt":[[4,5]]})", false).prompt_ids, (std::vector<int32_t>{4, 5}));
}

TEST(ServerApi, BadRequestsNameTheField) {
  struct Case {
    std::string body;
    bool chat;
    std::string param;
  };
  const std::vector<Case> cases = {
      {chat(R"("temperature":"hot")"), true, "temperature"},
      {chat(R"("temperature":3)"), true, "temperature"},
      {chat(R"("temperature":-1)"), true, "temperature"},
      {chat(R"("temperature":1e308)"), true, "temperature"},
      {chat(R"("top_p":0)"), true, "top_p"},
      {chat(R"("top_p":1.5)"), true, "top_p"},
      {chat(R"("top_k":1.5)"), true, "top_k"},
      {chat(R"("top_k":-2)"), true, "top_k"},
      {chat(R"("min_p":2)"), true, "min_p"},
      {chat(R"("presence_penalty":5)"), true, "presence_penalty"},
      {chat(R"("frequency_penalty":"x")"), true, "frequency_penalty"},
      {chat(R"("repetition_penalty":0)"), true, "repetition_penalty"},
      {chat(R"("max_tokens":0)"), true, "max_tokens"},
      {chat(R"("max_tokens":-5)"), true, "max_tokens"},
      {chat(R"("max_tokens":1e9)"), true, "max_tokens"},
      {chat(R"("max_tokens":99999999999999999999)"), true, "max_tokens"},
      {chat(R"("max_tokens":"12")"), true, "max_tokens"},
      {chat(R"("max_completion_tokens":true)"), true, "max_completion_tokens"},
      {chat(R"("stream":"yes")"), true, "stream"},
      {chat(R"("stream_options":1)"), true, "stream_options"},
      {chat(R"("seed":1.5)"), true, "seed"},
      {chat(R"("stop":5)"), true, "stop"},
      {chat(R"("stop":[""])"), true, "stop"},
      {chat(R"("stop":["a",1])"), true, "stop[1]"},
      {chat(R"("stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])"), true, "stop"},
      {chat(R"("n":2)"), true, "n"},
      {chat(R"("logprobs":true)"), true, "logprobs"},
      {chat(R"("logit_bias":{"5":1})"), true, "logit_bias"},
      {chat(R"("tools":[{"type":"function"}])"), true, "tools"},
      {chat(R"("response_format":{"type":"json_object"})"), true, "response_format"},
      {chat(R"("chat_template_kwargs":{"enable_thinking":"no"})"), true, "chat_template_kwargs.enable_thinking"},
      {chat(R"("model":5)"), true, "model"},
      {R"({"messages":"hi"})", true, "messages"},
      {R"({"messages":[]})", true, "messages"},
      {R"({"messages":[5]})", true, "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", true, "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", true, "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, "messages[0].content[0].type"},
      {R"({})", true, "messages"},
      {R"({"prompt":"x"})", true, "prompt"},
      {R"({})", false, "prompt"},
      {R"({"prompt":""})", false, "prompt"},
      {R"({"prompt":[]})", false, "prompt"},
      {R"({"prompt":[1,-2]})", false, "prompt"},
      {R"({"prompt":[1,3000000000]})", false, "prompt"},
      {R"({"prompt":[1,"a"]})", false, "prompt"},
      {R"({"prompt":["a","b"]})", false, "prompt"},
      {R"({"prompt":{"a":1}})", false, "prompt"},
      {R"({"prompt":"x","echo":true})", false, "echo"},
      {R"({"prompt":"x","suffix":"y"})", false, "suffix"},
      {R"({"prompt":"x","best_of":3})", false, "best_of"},
      {R"({"messages":[{"role":"user","content":"x"}]})", false, "messages"},
  };
  for (const auto& c : cases) {
    ApiError e = expect_error(c.body, c.chat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(ServerApi, MalformedBodies) {
  for (std::string b : {"", "nope", "{", "[1,2]", "\"str\"", "{\"messages\":[}", "{\"a\":NaN}", "null"}) {
    ApiError e = expect_error(b);
    EXPECT_EQ(e.status, 400) << b;
  }
  ApiError u = expect_error(std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"));
  EXPECT_EQ(u.status, 400);
  EXPECT_EQ(u.code, "invalid_utf8");
  ApiError deep = expect_error(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(deep.message.find("nested"), std::string::npos);
}

TEST(ServerApi, ErrorJsonShape) {
  ApiError e{413, "too big", "invalid_request_error", "", "body_too_large"};
  Json j = e.to_json();
  EXPECT_EQ(j.dump(),
            R"({"error":{"message":"too big","type":"invalid_request_error","param":null,"code":"body_too_large"}})");
}

TEST(ServerApi, JsonDepth) {
  EXPECT_EQ(json_depth(R"({"a":[1,{"b":"[[[["}]})", 100), 3);
  EXPECT_EQ(json_depth(R"("\"[")", 100), 0);
  EXPECT_EQ(json_depth(std::string(1000, '['), 10), 11);
}

TEST(ThinkSplitter, SplitsAndDoesNotDependOnChunking) {
  struct Case {
    bool inside;
    std::string text, reasoning, content;
  };
  const std::vector<Case> cases = {
      {false, "<think>\nlet me see</think>\n\nThe answer", "\nlet me see", "The answer"},
      {true, "reasoning here\n</think>\n\nAnswer <think>not this</think>", "reasoning here\n",
       "Answer <think>not this</think>"},
      {false, "plain text <think>x</think>", "", "plain text <think>x</think>"},
      {false, "<thin", "", "<thin"},
      {false, "<think>never closed </thi", "never closed </thi", ""},
      {true, "all reasoning", "all reasoning", ""},
      {false, "", "", ""},
      {false, "<think></think>\n\n\n", "", ""},
  };
  std::mt19937 rng(1);
  for (const auto& c : cases) {
    for (int trial = 0; trial < 50; ++trial) {
      ThinkSplitter sp(true, c.inside);
      std::string r, t;
      size_t i = 0;
      while (i < c.text.size()) {
        size_t n = trial == 0 ? c.text.size() : 1 + rng() % 4;
        sp.push(std::string_view(c.text).substr(i, n), r, t);
        i += n;
      }
      sp.finish(r, t);
      EXPECT_EQ(r, c.reasoning) << c.text;
      EXPECT_EQ(t, c.content) << c.text;
    }
  }
  ThinkSplitter off(false, false);
  std::string r, t;
  off.push("<think>x</think>y", r, t);
  off.finish(r, t);
  EXPECT_EQ(r, "");
  EXPECT_EQ(t, "<think>x</think>y");
}

TEST(ThinkSplitter, PromptOpensThink) {
  EXPECT_TRUE(ThinkSplitter::prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ThinkSplitter::prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ThinkSplitter::prompt_opens_think("<|im_start|>assistant\n"));
  EXPECT_FALSE(ThinkSplitter::prompt_opens_think(""));
}
