// Recursive-descent parser mirroring jinja2/parser.py. Recursion is guarded by a nesting
// counter and every node's height is capped (kMaxNesting), so hostile input such as 100k
// nested parentheses or a 100k-term a+b+... chain fails cleanly instead of overflowing.
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "chat/ast.h"
#include "chat/builtins.h"
#include "chat/stack_guard.h"

namespace dq::chat {

namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(Program& prog) : prog_(prog), toks_(lex(prog.source)) {}

  Body parse() {
    Body body = subparse({});
    for (const auto& n : body) check_names(*n, false);
    return body;
  }

  // jinja2 rejects unknown filters and tests when compiling, except inside if statements and
  // inline if-expressions ("soft" frames), where the check happens when they run. Loop, macro,
  // with, set-block and filter-block bodies are new frames and are strict again.
  void check_names(const Node& n, bool soft) {
    if (!soft && n.kind == NK::Filter && !is_filter_name(n.str))
      fail_at(n.pos, fmt::format("No filter named '{}'.", n.str));
    if (!soft && n.kind == NK::Test && !is_test_name(n.str))
      fail_at(n.pos, fmt::format("No test named '{}'.", n.str));
    auto walk = [&](const NodePtr& c, bool s) {
      if (c) check_names(*c, s);
    };
    auto walk_body = [&](const Body& b, bool s) {
      for (const auto& c : b) check_names(*c, s);
    };
    switch (n.kind) {
      case NK::If:
        for (const auto& c : n.list) walk(c, true);
        for (const auto& b : n.bodies) walk_body(b, true);
        return;
      case NK::CondExpr: walk(n.a, true); walk(n.b, true); walk(n.c, true); return;
      case NK::For:
        walk(n.b, soft);
        walk(n.c, false);
        for (const auto& b : n.bodies) walk_body(b, false);
        return;
      case NK::Macro:
        for (const auto& c : n.list) walk(c, false);
        walk_body(n.bodies[0], false);
        return;
      case NK::SetBlock: case NK::FilterBlock:
        walk(n.b, false);
        walk_body(n.bodies[0], false);
        return;
      case NK::With:
        for (const auto& c : n.list2) walk(c, soft);
        walk_body(n.bodies[0], false);
        return;
      default:
        walk(n.a, soft);
        walk(n.b, soft);
        walk(n.c, soft);
        for (const auto& c : n.list) walk(c, soft);
        for (const auto& c : n.list2) walk(c, soft);
        for (const auto& b : n.bodies) walk_body(b, soft);
    }
  }

 private:
  Program& prog_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  StackGuard stack_;
  std::vector<std::vector<std::string>> end_stack_;
  std::vector<std::string> tag_stack_;

  struct Guard {
    Parser& p;
    Guard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.fail(fmt::format("template nested too deeply (more than {} levels)", kMaxNesting));
      if (p.stack_.exhausted()) p.fail("template nested too deeply for this thread's stack");
    }
    ~Guard() { --p.depth_; }
  };

  // ---- token helpers
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  static bool is_op(const Token& t, std::string_view op) { return t.type == Tok::Op && t.text == op; }
  static bool is_name(const Token& t, std::string_view n) { return t.type == Tok::Name && t.text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(cur(), op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(cur(), n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const std::string& msg) { fail_at(cur().pos, msg); }
  [[noreturn]] void fail_at(uint32_t pos, const std::string& msg) { syntax_error(prog_.source, pos, msg); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Name: case Tok::Op: return t.text;
      case Tok::String: return "string";
      case Tok::Int: return "integer";
      case Tok::Float: return "float";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::VarEnd: return "end of print statement";
      case Tok::Data: return "template data";
      case Tok::Eof: return "end of template";
    }
    return "?";
  }

  const Token& expect(Tok type, std::string_view text, const char* what) {
    const Token& t = cur();
    if (t.type == type && (text.empty() || t.text == text)) return next();
    if (t.type == Tok::Eof) fail(fmt::format("unexpected end of template, expected '{}'.", what));
    fail(fmt::format("expected token '{}', got '{}'", what, describe(t)));
  }
  const Token& expect_op(std::string_view op) { return expect(Tok::Op, op, std::string(op).c_str()); }
  const Token& expect_name() { return expect(Tok::Name, {}, "name"); }
  void expect_block_end() { expect(Tok::BlockEnd, {}, "end of statement block"); }

  // ---- nodes
  NodePtr make(NK k, uint32_t pos) { return std::make_unique<Node>(k, pos); }

  NodePtr finish(NodePtr n) {
    uint32_t h = 0;
    auto take = [&](const NodePtr& c) {
      if (c) h = std::max(h, c->height);
    };
    take(n->a);
    take(n->b);
    take(n->c);
    for (const auto& c : n->list) take(c);
    for (const auto& c : n->list2) take(c);
    for (const auto& body : n->bodies)
      for (const auto& c : body) take(c);
    n->height = h + 1;
    if (n->height > static_cast<uint32_t>(kMaxNesting))
      fail_at(n->pos, fmt::format("template nested too deeply (more than {} levels)", kMaxNesting));
    return n;
  }

  NodePtr unary(NK k, uint32_t pos, NodePtr a) {
    NodePtr n = make(k, pos);
    n->a = std::move(a);
    return finish(std::move(n));
  }
  NodePtr binary(NK k, uint32_t pos, NodePtr a, NodePtr b) {
    NodePtr n = make(k, pos);
    n->a = std::move(a);
    n->b = std::move(b);
    return finish(std::move(n));
  }

  // ---- template structure
  static bool in(const std::vector<std::string>& set, const Token& t) {
    return t.type == Tok::Name && std::find(set.begin(), set.end(), t.text) != set.end();
  }

  Body subparse(const std::vector<std::string>& end_tokens) {
    Guard guard(*this);
    Body body;
    if (!end_tokens.empty()) end_stack_.push_back(end_tokens);
    while (cur().type != Tok::Eof) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        NodePtr n = make(NK::Data, t.pos);
        n->str = t.text;
        body.push_back(finish(std::move(n)));
        next();
      } else if (t.type == Tok::VarBegin) {
        uint32_t pos = next().pos;
        NodePtr n = make(NK::Output, pos);
        n->a = parse_tuple(false, true, {}, false);
        expect(Tok::VarEnd, {}, "end of print statement");
        body.push_back(finish(std::move(n)));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (!end_tokens.empty() && in(end_tokens, cur())) {
          end_stack_.pop_back();
          return body;
        }
        parse_statement(body);
        expect_block_end();
      } else {
        fail("internal parsing error");
      }
    }
    if (!end_tokens.empty()) end_stack_.pop_back();
    return body;
  }

  Body parse_statements(const std::vector<std::string>& end_tokens, bool drop_needle) {
    skip_op(":");
    expect_block_end();
    Body body = subparse(end_tokens);
    if (cur().type == Tok::Eof) fail_eof(end_tokens);
    if (drop_needle) next();
    return body;
  }

  [[noreturn]] void fail_eof(const std::vector<std::string>& end_tokens) {
    std::string msg = "Unexpected end of template.";
    if (!end_tokens.empty()) {
      std::string want;
      for (const auto& e : end_tokens) want += (want.empty() ? "'" : " or '") + e + "'";
      msg += " Jinja was looking for the following tags: " + want + ".";
    }
    if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
    fail(msg);
  }

  void parse_statement(Body& body) {
    const Token& t = cur();
    if (t.type != Tok::Name) fail("tag name expected");
    std::string tag = t.text;
    tag_stack_.push_back(tag);
    if (tag == "for") body.push_back(parse_for());
    else if (tag == "if") body.push_back(parse_if());
    else if (tag == "set") body.push_back(parse_set());
    else if (tag == "macro") body.push_back(parse_macro());
    else if (tag == "filter") body.push_back(parse_filter_block());
    else if (tag == "with") body.push_back(parse_with());
    else if (tag == "generation") body.push_back(parse_generation());
    else if (tag == "print") parse_print(body);
    else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside of a loop", tag));
      body.push_back(finish(make(tag == "break" ? NK::Break : NK::Continue, next().pos)));
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" ||
               tag == "from" || tag == "call" || tag == "autoescape") {
      fail(fmt::format("the '{}' tag is not supported by this engine", tag));
    } else {
      tag_stack_.pop_back();
      std::string msg = fmt::format("Encountered unknown tag '{}'.", tag);
      if (!end_stack_.empty()) {
        std::string want;
        for (const auto& e : end_stack_.back()) want += (want.empty() ? "'" : " or '") + e + "'";
        bool expected = false;
        for (const auto& set : end_stack_) expected = expected || in(set, t);
        msg += expected ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " + want + "."
                        : " Jinja was looking for the following tags: " + want + ".";
      }
      if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
      fail(msg);
    }
    tag_stack_.pop_back();
  }

  NodePtr parse_for() {
    NodePtr n = make(NK::For, next().pos);
    n->a = parse_assign_target(true, false, {"in"}, false);
    expect(Tok::Name, "in", "in");
    n->b = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) n->c = parse_expression(true);
    if (is_name(cur(), "recursive")) fail("recursive for loops are not supported by this engine");
    ++loop_depth_;
    n->bodies.push_back(parse_statements({"endfor", "else"}, false));
    --loop_depth_;
    if (next().text == "endfor") {
      n->bodies.emplace_back();
    } else {
      n->bodies.push_back(parse_statements({"endfor"}, true));
    }
    return finish(std::move(n));
  }

  NodePtr parse_if() {
    NodePtr n = make(NK::If, next().pos);
    while (true) {
      n->list.push_back(parse_tuple(false, false, {}, false));
      n->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") n->bodies.push_back(parse_statements({"endif"}, true));
      break;
    }
    return finish(std::move(n));
  }

  NodePtr parse_set() {
    uint32_t pos = next().pos;
    NodePtr target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      NodePtr n = make(NK::Set, pos);
      n->a = std::move(target);
      n->b = parse_tuple(false, true, {}, false);
      return finish(std::move(n));
    }
    NodePtr n = make(NK::SetBlock, pos);
    n->a = std::move(target);
    n->b = parse_filter(nullptr, false);
    n->bodies.push_back(parse_statements({"endset"}, true));
    return finish(std::move(n));
  }

  static void scan_names(const Node& n, bool& varargs, bool& kwargs) {
    if (n.kind == NK::Name) {
      varargs = varargs || n.str == "varargs";
      kwargs = kwargs || n.str == "kwargs";
    }
    for (const NodePtr* c : {&n.a, &n.b, &n.c})
      if (*c) scan_names(**c, varargs, kwargs);
    for (const auto& c : n.list) if (c) scan_names(*c, varargs, kwargs);
    for (const auto& c : n.list2) if (c) scan_names(*c, varargs, kwargs);
    for (const auto& body : n.bodies)
      for (const auto& c : body) scan_names(*c, varargs, kwargs);
  }

  NodePtr parse_macro() {
    NodePtr n = make(NK::Macro, next().pos);
    n->str = expect_name().text;
    expect_op("(");
    bool any_default = false;
    while (!is_op(cur(), ")")) {
      if (!n->names.empty()) expect_op(",");
      const Token& arg = expect_name();
      if (!can_assign_name(arg.text)) fail_at(arg.pos, "can't assign to 'const'");
      n->names.push_back(arg.text);
      if (skip_op("=")) {
        n->list.push_back(parse_expression(true));
        any_default = true;
      } else {
        if (any_default) fail("non-default argument follows default argument");
        n->list.push_back(nullptr);
      }
    }
    expect_op(")");
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->bodies.push_back(parse_statements({"endmacro"}, true));
    loop_depth_ = saved;
    for (const auto& c : n->bodies[0]) scan_names(*c, n->catch_varargs, n->catch_kwargs);
    return finish(std::move(n));
  }

  NodePtr parse_filter_block() {
    NodePtr n = make(NK::FilterBlock, next().pos);
    n->b = parse_filter(nullptr, true);
    n->bodies.push_back(parse_statements({"endfilter"}, true));
    return finish(std::move(n));
  }

  NodePtr parse_with() {
    NodePtr n = make(NK::With, next().pos);
    while (cur().type != Tok::BlockEnd) {
      if (!n->list.empty()) expect_op(",");
      n->list.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      n->list2.push_back(parse_expression(true));
    }
    n->bodies.push_back(parse_statements({"endwith"}, true));
    return finish(std::move(n));
  }

  // HF's AssistantTracker {% generation %}: renders its body (in a scope of its own).
  NodePtr parse_generation() {
    NodePtr n = make(NK::With, next().pos);
    n->bodies.push_back(parse_statements({"endgeneration"}, true));
    return finish(std::move(n));
  }

  void parse_print(Body& body) {
    next();
    bool first = true;
    while (cur().type != Tok::BlockEnd) {
      if (!first) expect_op(",");
      first = false;
      NodePtr n = make(NK::Output, cur().pos);
      n->a = parse_expression(true);
      body.push_back(finish(std::move(n)));
    }
  }

  static bool can_assign_name(const std::string& s) {
    return s != "true" && s != "false" && s != "none" && s != "True" && s != "False" && s != "None";
  }

  static bool can_assign(const Node& n) {
    if (n.kind == NK::Name) return can_assign_name(n.str);
    if (n.kind == NK::TupleLit) {
      for (const auto& c : n.list)
        if (!can_assign(*c)) return false;
      return true;
    }
    return n.kind == NK::NsRef;
  }

  static const char* node_label(const Node& n) {
    switch (n.kind) {
      case NK::Const: return "const";
      case NK::ListLit: return "list";
      case NK::DictLit: return "dict";
      case NK::TupleLit: return "tuple";
      default: return "expression";
    }
  }

  NodePtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                              bool with_namespace) {
    NodePtr target;
    if (with_namespace && is_op(look(), ".")) {
      const Token& name = expect_name();
      target = make(NK::NsRef, name.pos);
      target->str = name.text;
      next();
      target->str2 = expect_name().text;
      return finish(std::move(target));
    }
    if (name_only) {
      const Token& name = expect_name();
      target = make(NK::Name, name.pos);
      target->str = name.text;
      target = finish(std::move(target));
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false);
    } else {
      target = parse_primary();
    }
    if (!can_assign(*target)) fail_at(target->pos, fmt::format("can't assign to '{}'", node_label(*target)));
    return target;
  }

  // ---- expressions
  NodePtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  NodePtr parse_condexpr() {
    uint32_t pos = cur().pos;
    NodePtr expr1 = parse_or();
    while (skip_name("if")) {
      NodePtr n = make(NK::CondExpr, pos);
      n->a = parse_or();
      n->b = std::move(expr1);
      if (skip_name("else")) {
        Guard guard(*this);  // a if b else c if d else ... recurses here
        n->c = parse_condexpr();
      }
      expr1 = finish(std::move(n));
      pos = cur().pos;
    }
    return expr1;
  }

  NodePtr parse_or() {
    uint32_t pos = cur().pos;
    NodePtr left = parse_and();
    while (skip_name("or")) left = binary(NK::Or, pos, std::move(left), parse_and());
    return left;
  }

  NodePtr parse_and() {
    uint32_t pos = cur().pos;
    NodePtr left = parse_not();
    while (skip_name("and")) left = binary(NK::And, pos, std::move(left), parse_not());
    return left;
  }

  NodePtr parse_not() {
    if (is_name(cur(), "not")) {
      Guard guard(*this);
      uint32_t pos = next().pos;
      return unary(NK::Not, pos, parse_not());
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    uint32_t pos = cur().pos;
    NodePtr expr = parse_math1();
    NodePtr n;
    while (true) {
      const Token& t = cur();
      CmpKind k;
      if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                t.text == "<=" || t.text == ">" || t.text == ">=")) {
        k = t.text == "==" ? CmpKind::Eq : t.text == "!=" ? CmpKind::Ne : t.text == "<" ? CmpKind::Lt
            : t.text == "<=" ? CmpKind::Le : t.text == ">" ? CmpKind::Gt : CmpKind::Ge;
        next();
      } else if (skip_name("in")) {
        k = CmpKind::In;
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        next();
        next();
        k = CmpKind::NotIn;
      } else {
        break;
      }
      if (!n) {
        n = make(NK::Compare, pos);
        n->a = std::move(expr);
      }
      n->cmp.push_back(k);
      n->list.push_back(parse_math1());
    }
    return n ? finish(std::move(n)) : std::move(expr);
  }

  NodePtr bin(BinOp op, uint32_t pos, NodePtr a, NodePtr b) {
    NodePtr n = make(NK::Bin, pos);
    n->op = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return finish(std::move(n));
  }

  NodePtr parse_math1() {
    uint32_t pos = cur().pos;
    NodePtr left = parse_concat();
    while (is_op(cur(), "+") || is_op(cur(), "-")) {
      BinOp op = next().text == "+" ? BinOp::Add : BinOp::Sub;
      left = bin(op, pos, std::move(left), parse_concat());
    }
    return left;
  }

  NodePtr parse_concat() {
    uint32_t pos = cur().pos;
    NodePtr first = parse_math2();
    if (!is_op(cur(), "~")) return first;
    NodePtr n = make(NK::Concat, pos);
    n->list.push_back(std::move(first));
    while (skip_op("~")) n->list.push_back(parse_math2());
    return finish(std::move(n));
  }

  NodePtr parse_math2() {
    uint32_t pos = cur().pos;
    NodePtr left = parse_pow();
    while (true) {
      const Token& t = cur();
      BinOp op;
      if (is_op(t, "*")) op = BinOp::Mul;
      else if (is_op(t, "/")) op = BinOp::Div;
      else if (is_op(t, "//")) op = BinOp::FloorDiv;
      else if (is_op(t, "%")) op = BinOp::Mod;
      else break;
      next();
      left = bin(op, pos, std::move(left), parse_pow());
    }
    return left;
  }

  NodePtr parse_pow() {
    uint32_t pos = cur().pos;
    NodePtr left = parse_unary(true);
    while (skip_op("**")) left = bin(BinOp::Pow, pos, std::move(left), parse_unary(true));
    return left;
  }

  NodePtr parse_unary(bool with_filter) {
    Guard guard(*this);
    uint32_t pos = cur().pos;
    NodePtr node;
    if (is_op(cur(), "-")) {
      next();
      node = unary(NK::Neg, pos, parse_unary(false));
    } else if (is_op(cur(), "+")) {
      next();
      node = unary(NK::Pos, pos, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  NodePtr constant(uint32_t pos, Value v) {
    NodePtr n = make(NK::Const, pos);
    n->value = std::move(v);
    return finish(std::move(n));
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    uint32_t pos = t.pos;
    switch (t.type) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True") return constant(pos, Value::boolean(true));
        if (t.text == "false" || t.text == "False") return constant(pos, Value::boolean(false));
        if (t.text == "none" || t.text == "None") return constant(pos, Value::none());
        NodePtr n = make(NK::Name, pos);
        n->str = t.text;
        return finish(std::move(n));
      }
      case Tok::String: {
        std::string s = next().text;
        while (cur().type == Tok::String) s += next().text;
        return constant(pos, Value::string(std::move(s)));
      }
      case Tok::Int: return constant(pos, Value::integer(next().ival));
      case Tok::Float: return constant(pos, Value::number(next().fval));
      case Tok::Op:
        if (t.text == "(") {
          next();
          NodePtr n = parse_tuple(false, true, {}, true);
          expect_op(")");
          return n;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      case Tok::Eof: fail("unexpected end of template");
      default: break;
    }
    fail(fmt::format("unexpected '{}'", describe(t)));
  }

  // jinja2 passes extra_end_rules to Token.test_any as one tuple argument, so they never
  // match; we keep that behaviour ("for a, in x" is a syntax error there too).
  bool is_tuple_end(const std::vector<std::string>&) const {
    const Token& t = cur();
    return t.type == Tok::VarEnd || t.type == Tok::BlockEnd || is_op(t, ")");
  }

  NodePtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parentheses) {
    uint32_t pos = cur().pos;
    std::vector<NodePtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(cur(), ",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses)
        fail(fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    NodePtr n = make(NK::TupleLit, pos);
    n->list = std::move(args);
    return finish(std::move(n));
  }

  NodePtr parse_list() {
    NodePtr n = make(NK::ListLit, next().pos);
    while (!is_op(cur(), "]")) {
      if (!n->list.empty()) expect_op(",");
      if (is_op(cur(), "]")) break;
      n->list.push_back(parse_expression(true));
    }
    expect_op("]");
    return finish(std::move(n));
  }

  NodePtr parse_dict() {
    NodePtr n = make(NK::DictLit, next().pos);
    while (!is_op(cur(), "}")) {
      if (!n->list.empty()) expect_op(",");
      if (is_op(cur(), "}")) break;
      n->list.push_back(parse_expression(true));
      expect_op(":");
      n->list2.push_back(parse_expression(true));
    }
    expect_op("}");
    return finish(std::move(n));
  }

  NodePtr parse_postfix(NodePtr node) {
    while (true) {
      if (is_op(cur(), ".") || is_op(cur(), "[")) node = parse_subscript(std::move(node));
      else if (is_op(cur(), "(")) node = parse_call(std::move(node));
      else break;
    }
    return node;
  }

  NodePtr parse_filter_expr(NodePtr node) {
    while (true) {
      if (is_op(cur(), "|")) node = parse_filter(std::move(node), false);
      else if (is_name(cur(), "is")) node = parse_test(std::move(node));
      else if (is_op(cur(), "(")) node = parse_call(std::move(node));
      else break;
    }
    return node;
  }

  NodePtr parse_subscript(NodePtr node) {
    const Token& t = next();
    uint32_t pos = t.pos;
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::Name) {
        NodePtr n = make(NK::Getattr, pos);
        n->a = std::move(node);
        n->str = attr.text;
        return finish(std::move(n));
      }
      if (attr.type != Tok::Int) fail_at(attr.pos, "expected name or number");
      NodePtr n = make(NK::Getitem, pos);
      n->a = std::move(node);
      n->b = constant(attr.pos, Value::integer(attr.ival));
      return finish(std::move(n));
    }
    std::vector<NodePtr> args;
    while (!is_op(cur(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    NodePtr n = make(NK::Getitem, pos);
    n->a = std::move(node);
    if (args.size() == 1) {
      n->b = std::move(args[0]);
    } else {
      NodePtr tup = make(NK::TupleLit, pos);
      tup->list = std::move(args);
      n->b = finish(std::move(tup));
    }
    return finish(std::move(n));
  }

  NodePtr parse_subscribed() {
    uint32_t pos = cur().pos;
    NodePtr start, stop, step;
    if (is_op(cur(), ":")) {
      next();
    } else {
      NodePtr node = parse_expression(true);
      if (!is_op(cur(), ":")) return node;
      next();
      start = std::move(node);
    }
    if (!is_op(cur(), ":") && !is_op(cur(), "]") && !is_op(cur(), ",")) stop = parse_expression(true);
    if (is_op(cur(), ":")) {
      next();
      if (!is_op(cur(), "]") && !is_op(cur(), ",")) step = parse_expression(true);
    }
    NodePtr n = make(NK::Slice, pos);
    n->a = std::move(start);
    n->b = std::move(stop);
    n->c = std::move(step);
    return finish(std::move(n));
  }

  void parse_call_args(Node& n) {
    const Token& open = expect_op("(");
    uint32_t open_pos = open.pos;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(open_pos, "invalid syntax for function call expression");
    };
    while (!is_op(cur(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(cur(), ")")) break;
      }
      if (is_op(cur(), "*")) {
        ensure(!n.b && !n.c);
        next();
        n.b = parse_expression(true);
      } else if (is_op(cur(), "**")) {
        ensure(!n.c);
        next();
        n.c = parse_expression(true);
      } else if (cur().type == Tok::Name && is_op(look(), "=")) {
        ensure(!n.c);
        std::string key = next().text;
        next();
        n.names.push_back(key);
        n.list2.push_back(parse_expression(true));
      } else {
        ensure(!n.b && !n.c && n.list2.empty());
        n.list.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  NodePtr parse_call(NodePtr node) {
    NodePtr n = make(NK::Call, cur().pos);
    n->a = std::move(node);
    parse_call_args(*n);
    return finish(std::move(n));
  }

  NodePtr parse_filter(NodePtr node, bool start_inline) {
    while (is_op(cur(), "|") || start_inline) {
      if (!start_inline) next();
      const Token& name = expect_name();
      NodePtr n = make(NK::Filter, name.pos);
      n->str = name.text;
      while (is_op(cur(), ".")) {
        next();
        n->str += "." + expect_name().text;
      }
      if (is_op(cur(), "(")) parse_call_args(*n);
      n->a = std::move(node);
      node = finish(std::move(n));
      start_inline = false;
    }
    return node;
  }

  NodePtr parse_test(NodePtr node) {
    uint32_t pos = next().pos;
    bool negated = skip_name("not");
    const Token& name = expect_name();
    NodePtr n = make(NK::Test, pos);
    n->str = name.text;
    while (is_op(cur(), ".")) {
      next();
      n->str += "." + expect_name().text;
    }
    const Token& t = cur();
    if (is_op(t, "(")) {
      parse_call_args(*n);
    } else if ((t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Int ||
                t.type == Tok::Float || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      if (is_name(t, "is")) fail("You cannot chain multiple tests with is");
      NodePtr arg = parse_primary();
      n->list.push_back(parse_postfix(std::move(arg)));
    }
    n->a = std::move(node);
    NodePtr test = finish(std::move(n));
    return negated ? unary(NK::Not, pos, std::move(test)) : std::move(test);
  }
};

}  // namespace

std::shared_ptr<Program> parse_program(std::string_view text) {
  auto prog = std::make_shared<Program>(text);
  prog->body = Parser(*prog).parse();
  return prog;
}

}  // namespace dq::chat
