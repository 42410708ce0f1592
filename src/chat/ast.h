// The parsed template. One Node type for expressions and statements; which fields a kind uses
// is listed beside it. Every node records its height, which the parser caps, so evaluation and
// destruction recurse a bounded number of levels.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat/lexer.h"
#include "chat/value.h"

namespace dq::chat {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

enum class NK : uint8_t {
  // ---- expressions
  Const,     // value
  Name,      // str
  ListLit,   // list: items
  TupleLit,  // list: items
  DictLit,   // list: keys, list2: values
  Getattr,   // a: object, str: attribute
  Getitem,   // a: object, b: key (may be a Slice)
  Slice,     // a: start, b: stop, c: step (each may be null)
  Call,      // a: callee, list: positional, names+list2: keywords, b: *args, c: **kwargs
  Filter,    // a: subject (null inside filter blocks), str: name, args as Call
  Test,      // a: subject, str: name, args as Call
  Neg, Pos, Not,  // a
  And, Or,   // a, b
  Bin,       // op, a, b
  Concat,    // list
  Compare,   // a: first, list: operands, cmp: operators
  CondExpr,  // a: test, b: then, c: else (may be null)
  NsRef,     // str: namespace variable, str2: attribute (assignment target only)
  // ---- statements
  Data,        // str: text
  Output,      // a: expression
  If,          // list: tests; bodies: one per test, then the else body if any
  For,         // a: target, b: iterable, c: filter test; bodies[0]: body, bodies[1]: else
  Set,         // a: target, b: value
  SetBlock,    // a: target, b: filter chain or null; bodies[0]
  Macro,       // str: name, names: parameters, list: defaults (null where none); bodies[0]
  FilterBlock, // b: filter chain; bodies[0]
  With,        // list: targets, list2: values; bodies[0]
  Break, Continue,
};

enum class CmpKind : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Node {
  NK kind;
  uint32_t pos = 0;     // byte offset of the node's first token
  uint32_t height = 1;  // 1 + the tallest child
  BinOp op = BinOp::Add;
  bool catch_varargs = false, catch_kwargs = false;  // Macro
  std::string str, str2;
  Value value;
  NodePtr a, b, c;
  std::vector<NodePtr> list, list2;
  std::vector<std::string> names;
  std::vector<CmpKind> cmp;
  std::vector<Body> bodies;

  Node(NK k, uint32_t p) : kind(k), pos(p) {}
};

// A parsed template: the source (for positions) and the top-level body.
struct Program {
  Source source;
  Body body;
  explicit Program(std::string_view text) : source(text) {}
};

std::shared_ptr<Program> parse_program(std::string_view text);

}  // namespace dq::chat
