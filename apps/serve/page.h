// The explorer page's files (apps/serve/page/) and the web export's (apps/web/page/),
// compiled into the binary by apps/serve/embed_page.cmake: nothing is read from disk or
// fetched at run time.
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

/// The explorer page's file of that name, or nullptr.
const PageFile* page_file(const std::string& name);

/// The web export's file of that name (`tinylm export --format web`), or nullptr.
const PageFile* web_page_file(const std::string& name);

}  // namespace tinylm::serve
