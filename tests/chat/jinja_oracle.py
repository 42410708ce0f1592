#!/usr/bin/env python3
"""Reference renderer for the deltaq chat-template tests.

Renders Jinja templates exactly as HF transformers' apply_chat_template does
(transformers/utils/chat_template_utils.py: _compile_jinja_template / render_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols,
AssistantTracker]) with the globals raise_exception and strftime_now and HF's own tojson filter.

stdin:  a JSON list of cases. Each case has "template" and either
          "context": {...}                       rendered as given, or
          "chat": {"messages", "tools", "add_generation_prompt", "enable_thinking",
                   "bos_token", "eos_token", "extra"}   turned into the context HF builds.
stdout: a JSON list, one entry per case: {"text": "..."} or {"error": "..."}.
Exits 2 with a message on stderr when jinja2 is missing.
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2 import nodes
except ImportError as e:  # the C++ test turns this into a clear failure
    sys.stderr.write(f"jinja_oracle.py: python3-jinja2 is required ({e})\n")
    sys.exit(2)


class AssistantTracker(Extension):
    """HF's {% generation %} ... {% endgeneration %} block; without a mask request it just renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def hf_context(chat):
    """The keyword arguments render_jinja_template passes to template.render()."""
    ctx = {}
    if chat.get("bos_token"):
        ctx["bos_token"] = chat["bos_token"]
    if chat.get("eos_token"):
        ctx["eos_token"] = chat["eos_token"]
    ctx.update(chat.get("extra") or {})
    if chat.get("enable_thinking") is not None:
        ctx["enable_thinking"] = chat["enable_thinking"]
    return dict(messages=chat["messages"], tools=chat.get("tools"), documents=None,
                add_generation_prompt=chat.get("add_generation_prompt", True), **ctx)


def main():
    cases = json.load(sys.stdin)
    env = make_env()
    compiled = {}  # HF caches compiled templates too (lru_cache on _compile_jinja_template)
    out = []
    for case in cases:
        try:
            src = case["template"]
            if src not in compiled:
                compiled[src] = env.from_string(src)
            tmpl = compiled[src]
            ctx = hf_context(case["chat"]) if "chat" in case else case.get("context", {})
            out.append({"text": tmpl.render(**ctx)})
        except Exception as e:  # noqa: BLE001 - every failure is reported to the caller
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
