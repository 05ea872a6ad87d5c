// The state of a loaded tokenizer.json (shared by tokenizer.cpp and tokenizer_load.cpp).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/tokenizer_internal.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Tokenizer::Impl {
  std::string origin;
  std::vector<tok::NormForm> normalizers;  // applied in order

  struct PreStep {
    enum Kind { Split, ByteLevel } kind = Split;
    std::unique_ptr<tok::Regex> regex;  // Split
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    bool use_regex = false;
  };
  std::vector<PreStep> pre;
  std::unique_ptr<tok::Regex> gpt2_regex;  // when a ByteLevel step has use_regex

  tok::BpeModel model;
  std::unordered_map<uint32_t, const std::string*> model_id_to_token;  // points into model.vocab keys

  std::vector<tok::AddedToken> added;  // as listed in the file (duplicates resolved)
  std::unordered_map<uint32_t, size_t> added_by_id;
  tok::StringMap<size_t> added_by_content;
  std::unordered_set<std::string> special_contents;
  tok::TokenMatcher raw_matcher;         // added tokens with normalized = false: matched on the input
  tok::TokenMatcher normalized_matcher;  // normalized = true: matched on the normalized text

  enum class Decoder { None, ByteLevel } decoder = Decoder::None;

  // What the post_processor adds around the ids when add_special_tokens is set.
  std::vector<int32_t> prefix_ids, suffix_ids;

  int64_t vocab_size = 0;

  void encode_piece(std::string_view piece, std::vector<uint32_t>& ids) const;
};

std::unique_ptr<Tokenizer::Impl> load_tokenizer_impl(std::string_view json, const std::string& origin);

}  // namespace kiln
