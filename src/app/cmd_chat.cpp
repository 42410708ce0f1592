// deltaq chat: interactive chat (written with the generator).
#include "app/cli_common.h"
#include "core/error.h"

namespace dq::app {

Command add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "interactive chat with the model's chat template");
  return {cmd, []() -> int { fail("deltaq chat is not built yet"); }};
}

}  // namespace dq::app
