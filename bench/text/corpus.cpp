#include "corpus.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace dq::bench {
namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return size_t(next() % n); }
  bool chance(unsigned percent) { return below(100) < percent; }
  template <class T, size_t N>
  const T& pick(const std::array<T, N>& a) { return a[below(N)]; }
};

using W = std::string_view;

const std::array kEnglish = {
    W("the"), W("of"), W("and"), W("to"), W("in"), W("is"), W("that"), W("for"), W("it"), W("as"),
    W("was"), W("with"), W("be"), W("by"), W("on"), W("not"), W("he"), W("this"), W("are"), W("or"),
    W("his"), W("from"), W("at"), W("which"), W("but"), W("have"), W("an"), W("had"), W("they"),
    W("you"), W("were"), W("their"), W("one"), W("all"), W("we"), W("can"), W("her"), W("has"),
    W("there"), W("been"), W("if"), W("more"), W("when"), W("will"), W("would"), W("who"), W("so"),
    W("no"), W("model"), W("token"), W("memory"), W("kernel"), W("language"), W("weather"),
    W("mountain"), W("river"), W("government"), W("history"), W("science"), W("question"),
    W("answer"), W("because"), W("through"), W("between"), W("important"), W("different"),
    W("following"), W("without"), W("information"), W("development"), W("experience"),
    W("understanding"), W("particularly"), W("nevertheless"), W("extraordinary"), W("quickly"),
    W("brown"), W("fox"), W("jumps"), W("over"), W("lazy"), W("dog"), W("computer"), W("network"),
    W("library"), W("function"), W("variable"), W("people"), W("children"), W("world"), W("city"),
    W("don't"), W("it's"), W("we'll"), W("they've"), W("I'm"), W("she'd"), W("can't"), W("won't"),
    W("Paris"), W("London"), W("Einstein"), W("Shakespeare"), W("NASA"), W("UNESCO"), W("GPU")};

const std::array kRussian = {
    W("и"), W("в"), W("не"), W("на"), W("что"), W("это"), W("как"), W("по"), W("но"), W("он"),
    W("мы"), W("они"), W("быть"), W("был"), W("время"), W("человек"), W("работа"), W("жизнь"),
    W("день"), W("рука"), W("город"), W("страна"), W("вопрос"), W("ответ"), W("язык"), W("модель"),
    W("программа"), W("государство"), W("правительство"), W("исследование"), W("Москва"),
    W("Россия"), W("хорошо"), W("сегодня"), W("всегда"), W("никогда"), W("потому"), W("который"),
    W("большой"), W("новый"), W("последний"), W("значение"), W("развитие"), W("память")};

const std::array kArabic = {
    W("في"), W("من"), W("على"), W("إلى"), W("أن"), W("هذا"), W("التي"), W("الذي"), W("كان"),
    W("مع"), W("عن"), W("العالم"), W("الحكومة"), W("اللغة"), W("العربية"), W("الكتاب"),
    W("المدرسة"), W("الطالب"), W("الجامعة"), W("البحث"), W("العلوم"), W("التاريخ"), W("مرحبا"),
    W("شكرا"), W("الحاسوب"), W("البرنامج"), W("الذاكرة"), W("النموذج"), W("القاهرة"), W("بيروت"),
    W("كَتَبَ"), W("مُحَمَّد"), W("السَّلَامُ"), W("عَلَيْكُمْ")};

const std::array kHindi = {
    W("नमस्ते"), W("दुनिया"), W("भारत"), W("हिन्दी"), W("भाषा"), W("सरकार"), W("विज्ञान"),
    W("इतिहास"), W("प्रश्न"), W("उत्तर"), W("कंप्यूटर"), W("स्मृति"), W("मॉडल"), W("और"),
    W("के"), W("में"), W("है"), W("की"), W("को"), W("से"), W("पर"), W("यह"), W("था"), W("लिए"),
    W("क्या"), W("कृपया"), W("धन्यवाद"), W("विद्यालय"), W("प्रधानमंत्री"), W("स्वतंत्रता"),
    W("संस्कृत"), W("अंग्रेज़ी"), W("ज़िंदगी"), W("क़ानून")};

// Common Chinese characters; text is drawn per character.
constexpr std::string_view kChinese =
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对"
    "可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公"
    "同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正"
    "名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并"
    "语言模型计算机内存处理器数据网络历史科学问题答案北京上海中国世界你好谢谢";
constexpr std::string_view kChinesePunct[] = {"，", "。", "！", "？", "：", "；", "、", "（", "）", "“", "”"};

constexpr std::string_view kJapanese[] = {
    "日本語", "の", "テキスト", "です", "。", "カタカナ", "と", "ひらがな", "東京", "は", "に", "を",
    "が", "で", "した", "します", "ありがとう", "ございます", "コンピュータ", "メモリ", "モデル",
    "言語", "研究", "大学", "学生", "新しい", "世界", "、", "今日", "天気", "いい", "ですね", "ラーメン",
    "寿司", "富士山", "プログラミング", "ソフトウェア", "エンジニア", "ー", "っ", "ゃ"};

constexpr std::string_view kEmoji[] = {
    "😀", "😂", "🥲", "❤️", "👍", "👍🏽", "🙏🏿", "🎉", "🔥", "🚀", "🌍", "🍣", "🐍", "🤖", "✨",
    "👩‍👩‍👧", "👨‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "🇧🇷", "🧑🏻‍🔬", "☕", "⭐", "✅", "♻️", "1️⃣"};

// Latin with decomposed accents (base + combining mark): NFC must compose them.
constexpr std::string_view kDecomposed[] = {
    "e\xCC\x81t\xC3\xA9", "Tie\xCC\x82\xCC\x81ng Vie\xCC\xA3\xCC\x82t", "n\xCC\x83", "A\xCC\x8A",
    "c\xCC\xA7", "o\xCC\x88", "u\xCC\x88" "ber", "q\xCC\x81", "a\xCC\x80 la", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"};

constexpr std::string_view kIdentParts[] = {
    "get", "set", "buffer", "size", "index", "token", "cache", "model", "layer", "weight", "tensor",
    "count", "max", "min", "num", "ptr", "data", "value", "key", "node", "next", "prev", "head", "kv",
    "attn", "norm", "scale", "offset", "stride", "batch", "seq", "len", "id", "map", "list", "str"};

constexpr std::string_view kCodeOps[] = {" = ", " == ", " != ", " += ", " -> ", " && ", " || ",
                                         " + ", " * ", " / ", " << ", " >> ", " <= ", " % "};

void append_utf8_char(std::string& out, std::string_view s, size_t index) {
  // The index-th code point of s (s is valid UTF-8).
  size_t i = 0;
  for (size_t k = 0; k < index; ++k) {
    ++i;
    while (i < s.size() && (uint8_t(s[i]) & 0xC0) == 0x80) ++i;
  }
  size_t j = i + 1;
  while (j < s.size() && (uint8_t(s[j]) & 0xC0) == 0x80) ++j;
  out.append(s.substr(i, j - i));
}

void number(Rng& r, std::string& out) {
  switch (r.below(6)) {
    case 0: out += std::to_string(r.below(1000)); break;
    case 1: out += std::to_string(1900 + r.below(130)) + "-" + std::to_string(1 + r.below(12)) + "-" + std::to_string(1 + r.below(28)); break;
    case 2: out += std::to_string(r.below(100000)) + "." + std::to_string(r.below(100)); break;
    case 3: out += "$" + std::to_string(r.below(1000)) + "," + std::to_string(100 + r.below(900)) + ".99"; break;
    case 4: out += "+1 (" + std::to_string(200 + r.below(800)) + ") 555-" + std::to_string(1000 + r.below(9000)); break;
    default: out += std::to_string(r.next() % 10000000000ull); break;
  }
}

void identifier(Rng& r, std::string& out) {
  size_t parts = 1 + r.below(3);
  bool camel = r.chance(50);
  for (size_t k = 0; k < parts; ++k) {
    std::string p(kIdentParts[r.below(std::size(kIdentParts))]);
    if (k > 0) {
      if (camel)
        p[0] = char(p[0] - 'a' + 'A');
      else
        out += '_';
    }
    out += p;
  }
}

template <size_t N>
void words(Rng& r, std::string& out, const std::array<W, N>& list, size_t n, std::string_view end) {
  for (size_t k = 0; k < n; ++k) {
    if (k > 0) out += r.chance(3) ? "  " : " ";
    out += r.pick(list);
    if (r.chance(8)) out += r.chance(50) ? "," : ";";
    if (r.chance(3)) {
      out += ' ';
      number(r, out);
    }
  }
  out += end;
}

void english(Rng& r, std::string& out) {
  size_t sentences = 2 + r.below(8);
  for (size_t s = 0; s < sentences; ++s) {
    size_t start = out.size();
    words(r, out, kEnglish, 4 + r.below(18), r.chance(80) ? ". " : (r.chance(50) ? "? " : "! "));
    if (out[start] >= 'a' && out[start] <= 'z') out[start] = char(out[start] - 'a' + 'A');
    if (r.chance(10)) out += "\"Really?\" she asked. ";
    if (r.chance(5)) out += r.chance(50) ? "\n" : "\r\n";
  }
}

void code(Rng& r, std::string& out) {
  size_t lines = 3 + r.below(15);
  int indent = 0;
  for (size_t l = 0; l < lines; ++l) {
    out.append(size_t(indent) * 4, ' ');
    switch (r.below(6)) {
      case 0:
        out += "def ";
        identifier(r, out);
        out += "(self, ";
        identifier(r, out);
        out += "):\n";
        indent = std::min(indent + 1, 4);
        continue;
      case 1:
        out += "for (int i = 0; i < ";
        identifier(r, out);
        out += "; ++i) {\n";
        indent = std::min(indent + 1, 4);
        continue;
      case 2:
        out += "return ";
        identifier(r, out);
        out += kCodeOps[r.below(std::size(kCodeOps))];
        number(r, out);
        out += ";\n";
        indent = std::max(indent - 1, 0);
        continue;
      case 3:
        out += "// TODO(";
        identifier(r, out);
        out += "): fix the off-by-one in ";
        identifier(r, out);
        out += "()\n";
        continue;
      case 4:
        out += "\tprintf(\"%d %s\\n\", ";
        identifier(r, out);
        out += ", \"";
        words(r, out, kEnglish, 3, "\");\n");
        continue;
      default:
        identifier(r, out);
        out += kCodeOps[r.below(std::size(kCodeOps))];
        identifier(r, out);
        out += "[" + std::to_string(r.below(64)) + "];\n";
    }
  }
}

void chinese(Rng& r, std::string& out) {
  size_t n = kChinese.size() / 3;  // all 3-byte characters
  size_t chars = 20 + r.below(120);
  for (size_t k = 0; k < chars; ++k) {
    append_utf8_char(out, kChinese, r.below(n));
    if (r.chance(8)) out += kChinesePunct[r.below(std::size(kChinesePunct))];
    if (r.chance(2)) number(r, out);
  }
  out += "。";
}

void japanese(Rng& r, std::string& out) {
  size_t n = 10 + r.below(60);
  for (size_t k = 0; k < n; ++k) out += kJapanese[r.below(std::size(kJapanese))];
  out += "。";
}

void emoji(Rng& r, std::string& out) {
  size_t n = 3 + r.below(12);
  for (size_t k = 0; k < n; ++k) {
    if (r.chance(50)) out += kEnglish[r.below(kEnglish.size())];
    out += r.chance(70) ? " " : "";
    out += kEmoji[r.below(std::size(kEmoji))];
    if (r.chance(30)) out += kEmoji[r.below(std::size(kEmoji))];
  }
  out += "\n";
}

void decomposed(Rng& r, std::string& out) {
  size_t n = 3 + r.below(10);
  for (size_t k = 0; k < n; ++k) {
    out += kDecomposed[r.below(std::size(kDecomposed))];
    out += ' ';
    out += kEnglish[r.below(kEnglish.size())];
    out += ' ';
  }
}

void whitespace(Rng& r, std::string& out) {
  static constexpr std::string_view ws[] = {"   ", "\t\t", "\n\n\n", " \n ", "\r\n", "\u00a0", "\u3000", "    \t"};
  size_t n = 2 + r.below(6);
  for (size_t k = 0; k < n; ++k) {
    out += ws[r.below(std::size(ws))];
    out += kEnglish[r.below(kEnglish.size())];
  }
}

}  // namespace

std::vector<std::string> make_documents(size_t bytes, uint64_t seed) {
  Rng r{seed};
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < bytes) {
    std::string d;
    size_t parts = 1 + r.below(6);
    for (size_t p = 0; p < parts; ++p) {
      // Weights: English 30, code 15, Chinese 12, Japanese 8, Russian 8, Arabic 6, Hindi 6,
      // emoji 6, decomposed Latin 3, whitespace runs 3, numbers 3.
      size_t k = r.below(100);
      if (k < 30) english(r, d);
      else if (k < 45) code(r, d);
      else if (k < 57) chinese(r, d);
      else if (k < 65) japanese(r, d);
      else if (k < 73) words(r, d, kRussian, 5 + r.below(30), ". ");
      else if (k < 79) words(r, d, kArabic, 5 + r.below(30), ". ");
      else if (k < 85) words(r, d, kHindi, 5 + r.below(30), "। ");
      else if (k < 91) emoji(r, d);
      else if (k < 94) decomposed(r, d);
      else if (k < 97) whitespace(r, d);
      else {
        for (int i = 0; i < 8; ++i) {
          number(r, d);
          d += i % 3 == 2 ? "\n" : " ";
        }
      }
      if (r.chance(30)) d += "\n";
    }
    total += d.size() + 2;
    docs.push_back(std::move(d));
  }
  return docs;
}

std::string join_documents(const std::vector<std::string>& docs) {
  std::string out;
  for (size_t k = 0; k < docs.size(); ++k) {
    if (k > 0) out += "\n\n";
    out += docs[k];
  }
  return out;
}

}  // namespace dq::bench
