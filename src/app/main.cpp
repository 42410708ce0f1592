// deltaq: the command line. Each command lives in its own file (cmd_*.cpp).
#include <cstdio>

#include "app/cli_common.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace dq::app;
  CLI::App app{"deltaq: a Qwen3.5 inference engine (MLX 4-bit and HF bf16 checkpoints; CPU and CUDA)", "deltaq"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");
  std::vector<Command> cmds = {add_demo(app), add_run(app), add_score(app), add_inspect(app), add_bench(app),
                               add_make_model(app)};
#if DELTAQ_HAVE_TEXT
  for (auto add : {add_chat, add_tokenize, add_template, add_perplexity}) cmds.push_back(add(app));
#endif
#if DELTAQ_HAVE_SERVER
  cmds.push_back(add_serve(app));
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "deltaq: %s\n\n", e.what());
    CLI::App* sub = nullptr;
    for (const Command& c : cmds)
      if (c.app->parsed()) sub = c.app;
    std::fprintf(stderr, "%s", (sub ? sub : &app)->help().c_str());
    return 2;
  }
  for (const Command& c : cmds) {
    if (!c.app->parsed()) continue;
    try {
      return c.run();
    } catch (const dq::Error& e) {
      std::fprintf(stderr, "deltaq %s: error: %s\n", c.app->get_name().c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "deltaq %s: error: %s\n", c.app->get_name().c_str(), e.what());
      return 1;
    }
  }
  return 2;
}
