// `kiln tokenize` and `kiln detokenize`: a model's tokenizer.json on the command line.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <iterator>

#include "commands.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

namespace {
void add_source(CLI::App* sub, TokenizerArgs& a) {
  auto* m = sub->add_option("-m,--model", a.model_dir, "Model directory (reads DIR/tokenizer.json)");
  auto* t = sub->add_option("--tokenizer", a.tokenizer_file, "A tokenizer.json file");
  m->excludes(t);
}

Tokenizer load(const TokenizerArgs& a) {
  if (a.model_dir.empty() && a.tokenizer_file.empty())
    throw Error("give the tokenizer as -m DIR (a model directory) or --tokenizer FILE (a tokenizer.json)");
  return a.model_dir.empty() ? Tokenizer::from_file(a.tokenizer_file) : Tokenizer::from_model_dir(a.model_dir);
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    const auto b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
      throw Error(str("detokenize: '", item, "' (item ", ids.size() + 1, ") is not a token id; expected ids like 1,2,3"));
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
    if (j == s.size() - 1) throw Error("detokenize: the id list ends with a comma");
  }
  return ids;
}
}  // namespace

CLI::App* add_tokenize(CLI::App& app, TokenizerArgs& a) {
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of TEXT, comma-separated");
  add_source(sub, a);
  sub->add_option("text", a.text, "The text (UTF-8); - reads standard input")->required();
  sub->add_flag("--no-special", a.no_special, "Do not add what the post-processor adds (e.g. a BOS token)");
  return sub;
}

CLI::App* add_detokenize(CLI::App& app, TokenizerArgs& a) {
  auto* sub = app.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  add_source(sub, a);
  sub->add_option("ids", a.text, "Token ids, e.g. 1,2,3")->required();
  sub->add_flag("--skip-special", a.skip_special, "Leave special tokens out of the text");
  return sub;
}

int run_tokenize(const TokenizerArgs& a) {
  const Tokenizer tok = load(a);
  std::string text = a.text;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tok.encode(text, !a.no_special);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  std::cout << out << "\n";
  return 0;
}

int run_detokenize(const TokenizerArgs& a) {
  const Tokenizer tok = load(a);
  const std::vector<int32_t> ids = parse_ids(a.text);
  // tokenizers skips ids it does not know; on the command line that is more likely a mistake: say so.
  for (int32_t id : ids)
    if (!tok.id_to_token(id))
      throw Error(str("detokenize: id ", id, " is in no vocabulary of this tokenizer (ids 0 to ", tok.vocab_size() - 1, ")"));
  std::cout << tok.decode(ids, a.skip_special) << "\n";
  return 0;
}

}  // namespace kiln::cli
