// JSON from untrusted files: nlohmann's parser, made strict where it is lenient.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln::io {

// Parses `text` as one JSON value (only whitespace around it), rejecting what nlohmann accepts silently or
// cannot bound: duplicate keys in an object (nlohmann keeps the last), nesting deeper than `max_depth`
// (the document tree is freed recursively, so depth must be bounded), and text that is not UTF-8. Errors
// are kiln::Error naming `source`, with the JSON path of a duplicate key.
nlohmann::json parse_json_strict(std::string_view text, const std::string& source, int max_depth = 64);

// Reads a whole file (at most `max_bytes`), naming it in errors.
std::string read_text_file(const std::string& path, size_t max_bytes);

}  // namespace kiln::io
