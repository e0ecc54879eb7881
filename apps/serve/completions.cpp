// POST /v1/completions: OpenAI's completions API, streamed as server-sent events on request.
#include "request.h"
#include "state.h"

#include <tinylm/data/tokenizer.h>
#include <tinylm/generate.h>


#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

namespace tinylm::serve {

namespace {

using json = nlohmann::json;

/// The text a completion adds, as its tokens arrive. Each new token is decoded with the
/// tokens before it that are not yet settled and a few settled ones for context (so a
/// tokenizer's spaces come out right), and settles once it completes a character: the work
/// per token stays constant however long the completion. What may still change is held
/// back from take(): a character cut mid-way (U+FFFD at the end) and a tail that could be
/// the start of a stop sequence.
class CompletionText {
 public:
  CompletionText(const data::Tokenizer& tokenizer, const std::vector<int64_t>& prompt,
                 std::vector<std::string> stops)
      : tokenizer_(tokenizer), stops_(std::move(stops)) {
    context_.assign(prompt.end() - std::min<size_t>(prompt.size(), kContext), prompt.end());
    prefix_ = tokenizer_.decode(context_);
    for (const auto& s : stops_) hold_ = std::max(hold_, s.size() - 1);
  }
  /// Adds a token; false once a stop sequence appeared (the text ends before it).
  bool add(int64_t id) {
    pending_.push_back(id);
    ++tokens_;
    auto window = context_;
    window.insert(window.end(), pending_.begin(), pending_.end());
    const auto full = tokenizer_.decode(window);
    const auto piece = full.rfind(prefix_, 0) == 0 ? full.substr(prefix_.size()) : tokenizer_.decode(pending_);
    text_ = settled_ + piece;
    if (!ends_cut(piece) || pending_.size() >= 64) {  // settled (64: bytes that never form a character)
      settled_ = text_;
      context_ = std::move(window);
      if (context_.size() > kContext) context_.erase(context_.begin(), context_.end() - kContext);
      prefix_ = tokenizer_.decode(context_);
      pending_.clear();
    }
    for (const auto& s : stops_) {
      const auto at = text_.find(s, searched_);
      if (at != std::string::npos) {
        text_.resize(at);
        stopped_ = true;
      }
    }
    if (!stopped_ && text_.size() > hold_ + 8) searched_ = text_.size() - hold_ - 8;
    return !stopped_;
  }
  /// The text not yet handed out that can no longer change (all of it when final).
  std::string take(bool final) {
    size_t ready = text_.size();
    if (!final && !stopped_) {
      while (ready >= 3 && ends_cut(std::string_view(text_).substr(0, ready))) ready -= 3;
      ready = ready > hold_ ? ready - hold_ : 0;
      while (ready > 0 && ready < text_.size() && (static_cast<unsigned char>(text_[ready]) & 0xC0) == 0x80)
        --ready;  // a character's first byte
    }
    if (ready <= sent_) return {};
    auto out = text_.substr(sent_, ready - sent_);
    sent_ = ready;
    return out;
  }
  int64_t tokens() const { return tokens_; }

 private:
  static constexpr size_t kContext = 8;
  /// Whether text ends with U+FFFD: a character that more tokens may complete.
  static bool ends_cut(std::string_view text) {
    return text.size() >= 3 && text.substr(text.size() - 3) == "\xEF\xBF\xBD";
  }
  const data::Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int64_t> context_, pending_;
  std::string prefix_, settled_, text_;
  size_t hold_ = 0, sent_ = 0, searched_ = 0;
  int64_t tokens_ = 0;
  bool stopped_ = false;
};

}  // namespace

void Server::State::completions(const HttpRequest& req, HttpResponder& res) {
  const auto c = parse_completion(parse_body(req), {model.id, options.max_tokens, run.model->vocab_size(),
                                                    run.model->context_length()});
  std::vector<int64_t> prompt = c.prompt_ids;
  std::string prompt_text = c.prompt_text;
  if (c.prompt_ids.empty()) {
    prompt = encode_prompt(prompt_text);
  } else {
    prompt_text = run.tokenizer->decode(prompt);
  }
  const auto& g = c.generate;
  const auto& stops = c.stops;
  const bool stream = c.stream, echo = c.echo, include_usage = c.include_usage;

  const auto slot = admit_completion();
  const std::string id = "cmpl-" + std::to_string(next_id++);
  const auto created = static_cast<int64_t>(std::time(nullptr));
  CompletionText text(*run.tokenizer, prompt, stops);
  std::string finish = "length";
  // One event per piece of text: the parts that do not change are made once.
  const std::string head = "data: {\"id\":\"" + id + "\",\"object\":\"text_completion\",\"created\":" +
                           std::to_string(created) + ",\"model\":" + dump(json(model.id)) + ",\"choices\":[{\"text\":";
  auto chunk = [&](const std::string& piece, const json& reason) {
    return head + dump(json(piece)) + ",\"index\":0,\"logprobs\":null,\"finish_reason\":" + reason.dump() + "}]}\n\n";
  };
  if (stream && !res.start_stream("text/event-stream")) return;
  if (stream && echo) res.write_chunk(chunk(prompt_text, nullptr));
  if (g.max_new_tokens > 0) {
    // Decoded with every other completion (decode_loop.h); the tokens made while this
    // thread wrote the last event go out as one event.
    const auto tokens = submit(prompt, g, /*every_token=*/stream || !stops.empty());
    std::vector<int64_t> got;
    bool more = true;
    while (more) {
      got.clear();
      // A stream sends at most one event a millisecond: its first token at once, then
      // what came meanwhile (a person cannot see a millisecond; a client pays per event).
      more = tokens->take(got, std::chrono::milliseconds(50), std::chrono::microseconds(stream ? 1000 : 0));
      bool ended = false;
      for (const int64_t id : got)
        if (!text.add(id)) {
          finish = "stop";
          ended = true;
          break;
        }
      if (!ended && cancelled()) finish = "cancelled", ended = true;
      if (!ended && stream && !got.empty()) {
        const auto piece = text.take(false);
        ended = !piece.empty() && !res.write_chunk(chunk(piece, nullptr));
      }
      if (!ended && !stream) ended = res.client_gone();  // a stream learns it from its writes
      if (ended) {
        tokens->cancel();
        break;
      }
    }
    const auto error = tokens->error();
    if (!more && !error.empty()) {
      if (!stream) throw Reject{500, error, "server_error"};
      finish = "error";
    }
  }
  ++served;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  const json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", text.tokens()},
                      {"total_tokens", prompt_tokens + text.tokens()}};
  if (stream) {
    const auto rest = text.take(true);
    if (!rest.empty()) res.write_chunk(chunk(rest, nullptr));
    res.write_chunk(chunk("", finish));
    if (include_usage)
      res.write_chunk("data: " +
                      dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                                {"choices", json::array()}, {"usage", usage}}) +
                      "\n\n");
    res.write_chunk("data: [DONE]\n\n");
    res.end_stream();
    return;
  }
  const auto out = (echo ? prompt_text : std::string()) + text.take(true);
  res.send(200, "application/json",
           dump(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                     {"choices", {{{"text", out}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}}}},
                     {"usage", usage}}));
}

}  // namespace tinylm::serve
