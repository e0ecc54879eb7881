// The explorer page's files (apps/serve/page/), compiled into the binary by
// apps/serve/embed_page.cmake: nothing is read from disk or fetched at run time.
#pragma once

#include <cstddef>
#include <string>

namespace tinylm::serve {

struct PageFile {
  const char* name;          // "index.html"
  const char* content_type;  // "text/html; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

/// The file of that name, or nullptr.
const PageFile* page_file(const std::string& name);

}  // namespace tinylm::serve
