// deltaq serve: the OpenAI-compatible HTTP server (placeholder while it is being written).
#include "app/cli_common.h"
#include "core/error.h"

namespace dq::app {

Command add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  return {cmd, []() -> int { fail("deltaq serve is not built yet"); }};
}

}  // namespace dq::app
