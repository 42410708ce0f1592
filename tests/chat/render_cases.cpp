// chat_render_cases: the engine's side of jinja_oracle.py's protocol, for debugging mismatches.
//   echo '[{"template": "{{ 1 + 2 }}", "context": {}}]' | chat_render_cases
// Reads a JSON list of cases ({"template", "context"} or {"template", "chat"}) on stdin and
// writes a JSON list of {"text": ...} or {"error": ...} on stdout.
#include <iostream>
#include <iterator>

#include "chat/template.h"

using dq::chat::Json;

int main() {
  std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  Json cases = Json::parse(in);
  Json out = Json::array();
  for (const Json& c : cases) {
    try {
      auto t = dq::chat::Template::parse(c.at("template").get<std::string>());
      if (c.contains("chat")) {
        const Json& ch = c["chat"];
        dq::chat::ChatInput ci;
        ci.messages = ch.at("messages");
        ci.tools = ch.value("tools", Json());
        ci.add_generation_prompt = ch.value("add_generation_prompt", true);
        if (ch.contains("enable_thinking") && !ch["enable_thinking"].is_null())
          ci.enable_thinking = ch["enable_thinking"].get<bool>();
        ci.extra = ch.value("extra", Json::object());
        ci.bos_token = ch.value("bos_token", "");
        ci.eos_token = ch.value("eos_token", "");
        out.push_back({{"text", dq::chat::apply(t, ci)}});
      } else {
        out.push_back({{"text", t.render(c.value("context", Json::object()))}});
      }
    } catch (const dq::chat::TemplateError& e) {
      out.push_back({{"error", e.what()}});
    }
  }
  std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}
