// Internal: user text shown in messages (one line, escaped), UTF-8 checks, sizes as
// people read them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::internal {

/// `s` for an error message: control characters (C0, DEL, C1) and bytes that are not
/// UTF-8 are written as \xNN, so a message stays one readable line whatever the user typed.
std::string printable(std::string_view s);

/// `s` for a terminal: as printable(), but newlines and tabs kept, so text from a model
/// reads as text and cannot send the terminal an escape sequence.
std::string for_terminal(std::string_view s);

/// The length of the longest prefix of `s` that is valid UTF-8 (== s.size() when all of
/// it is): what a reader of text files checks before taking a file.
size_t utf8_valid_prefix(std::string_view s);

/// 3 when `s` starts with a UTF-8 byte-order mark (EF BB BF, which Notepad and
/// PowerShell write at the start of a UTF-8 file), else 0: readers of text a person may
/// have saved skip that many bytes at the start of a file (and only there).
size_t utf8_bom_length(std::string_view s);

/// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

/// The items with ", " between them: "tiny, transformer".
std::string join(const std::vector<std::string>& items);

/// The lines of `text`, without their '\n' (a last line need not end in one).
std::vector<std::string> split_lines(const std::string& text);

/// Levenshtein distance, for "did you mean" hints on misspelt names.
size_t edit_distance(const std::string& a, const std::string& b);

/// Bytes as "1.50 GiB", "12.0 MiB", "3.2 TiB".
std::string human_bytes(double bytes);

}  // namespace tinylm::internal
