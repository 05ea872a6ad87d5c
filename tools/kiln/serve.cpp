// `kiln serve`: an OpenAI-compatible HTTP server over one model (cpp-httplib: a maintained HTTP/1.1 server,
// packaged by Debian, with keep-alive, chunked responses, timeouts and a thread pool; docs/architecture.md).
//
// Requests are validated on the HTTP threads (a 400 naming the field, 401, 413, 429) and queued; one engine
// thread owns the model and decodes up to --max-batch of them together (continuous batching: a request joins
// the batch when there is room and leaves at the token that ends it; the sequences' KV caches are blocks of one
// paged cache, and prompt blocks stay cached for later requests that begin alike), handing each token's text
// to the request's stream. A client that disconnects cancels its request at the next token. SIGTERM and SIGINT stop accepting, let
// the running and queued requests finish, and exit 0.
#include "serve.h"

#include <httplib.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>

#include "kiln/chat.h"
#include "kiln/llm/generate.h"
#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "kiln/tokenizer.h"
#include "serve_request.h"

namespace kiln::cli {

namespace {

using json = nlohmann::json;

// ---- errors in OpenAI's shape (their validation: serve_request.h) -------------------------------------------------

void send_error(httplib::Response& res, const HttpError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"code", nullptr}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  res.status = e.status;
  res.set_content(json{{"error", err}}.dump(), "application/json");
}

// ---- a request and its stream ---------------------------------------------------------------------------------

// One generated token's log-probability, and the most likely tokens at its position with theirs.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// A request being served: the validated request, then what the engine thread hands to the HTTP thread.
struct Job : GenerationRequest {
  // Written by the engine thread, read by the HTTP thread under `mu`.
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;  // text not yet sent
  // With top_logprobs >= 0: the chosen token's log-probability and that many alternatives (OpenAI's
  // top_logprobs) per token, under the model's distribution before any sampling setting.
  std::vector<TokenLogprob> pending_logprobs;  // entries not yet sent
  bool done = false;
  std::string finish_reason;
  std::string error;
  int64_t generated = 0;
  std::atomic<bool> cancelled{false};
};

struct Metrics {
  std::atomic<int64_t> requests{0}, errors{0}, prompt_tokens{0}, generated_tokens{0}, cancelled{0};
  std::atomic<int64_t> prefix_reused_tokens{0};
  std::atomic<double> prefill_seconds{0}, decode_seconds{0};
};

// The model, its tokenizer, its paged KV cache, the queue and the running batch; one engine thread (continuous
// batching: requests join the batch when there is room and leave it at the token that ends them).
class Engine {
 public:
  Engine(llm::Model model, std::optional<Tokenizer> tok, std::optional<ChatTemplate> chat, const ServeOptions& o)
      : model_(std::move(model)), tok_(std::move(tok)), chat_(std::move(chat)), o_(o) {
    const int64_t blocks = o.kv_tokens > 0 ? (o.kv_tokens + kBlock - 1) / kBlock : o.max_batch * ((o.ctx + kBlock - 1) / kBlock);
    cache_ = model_.new_kv_cache(blocks, kBlock);
    kv_blocks_ = kv_free_ = cache_.num_blocks();
    thread_ = std::thread([this] { run(); });
  }

  ~Engine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  const llm::Model& model() const { return model_; }
  const Tokenizer* tokenizer() const { return tok_ ? &*tok_ : nullptr; }
  const ChatTemplate* chat() const { return chat_ ? &*chat_ : nullptr; }
  Metrics& metrics() { return metrics_; }

  size_t queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }
  int64_t running() const { return running_.load(); }
  struct CacheUse {
    int64_t blocks, free, cached;
  };
  CacheUse cache_use() const { return {kv_blocks_, kv_free_.load(), kv_cached_.load()}; }
  int64_t cache_bytes() const { return cache_.bytes(); }
  int64_t running_peak() const { return running_peak_.load(); }

  // Queues a job. The queue holds the jobs about to take a free place in the batch and, beyond those,
  // --max-queue jobs that wait for one; more is a 429 (so --max-batch clients arriving at once all get in).
  void submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t free_places = std::max<int64_t>(0, o_.max_batch - places_taken_.load());
      if (static_cast<int64_t>(queue_.size()) >= o_.max_queue + free_places)
        throw HttpError{429, str("the server has ", queue_.size(), " requests waiting and ", o_.max_batch - free_places,
                                 " of its ", o_.max_batch, " batch places taken; try again later"),
                        "", "rate_limit_error"};
      queue_.push_back(job);
    }
    cv_.notify_one();
  }

 private:
  static constexpr int64_t kBlock = 16;  // positions per block of the paged KV cache

  // A job in the batch: its sequence (blocks of the paged KV cache) and the blocks set aside for it, its
  // generator (the seed's stream, as generate() draws it), the tokens so far and how much of their text the
  // stream has been given.
  struct Active {
    std::shared_ptr<Job> job;
    llm::Sequence seq;
    int64_t reserved = 0;
    Generator gen;
    std::vector<int32_t> ids;
    std::string text;
    size_t sent = 0;
    // Incremental detokenization: `text` holds the decoded ids[0, read); the next piece is what decoding
    // ids[prefix, ...) adds to decoding ids[prefix, read) (a window of a few tokens, so each token costs the
    // same however long the output, and a tokenizer that treats a text's first token apart decodes alike).
    size_t prefix = 0, read = 0;
    bool cut = false;  // the text ended at a stop string
    std::string reason = "length";
    size_t prefilled = 0;  // prompt tokens in the sequence's cache (reused or run)
    std::optional<TokenLogprob> logprob;  // the next accepted token's, when the job asks for them
  };

  // The log-probabilities behind token t sampled from `logits` [V], when a's job asks for them.
  static void record_logprob(Active& a, const Tensor& logits, int64_t t) {
    if (a.job->top_logprobs < 0) return;
    const Tensor lp = log_softmax(logits, 0, DType::F32);
    TokenLogprob e;
    e.id = static_cast<int32_t>(t);
    e.logprob = lp.select(0, t).item<float>();
    if (a.job->top_logprobs > 0) {
      auto [values, indices] = topk(lp, std::min(a.job->top_logprobs, lp.size(0)));
      const Tensor v = values.cpu().contiguous(), i = indices.cpu().to(DType::I64).contiguous();
      for (int64_t k = 0; k < v.numel(); ++k)
        e.top.emplace_back(static_cast<int32_t>(i.data<int64_t>()[k]), v.data<float>()[k]);
    }
    a.logprob = std::move(e);
  }

  // Each pass: queued jobs join while there is room; one prompt chunk runs (so a long prompt does not stall the batch
  // for its whole length); then one decode step of the batch.
  void run() {
    std::vector<Active> batch;
    std::deque<Active> prefilling;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (batch.empty() && prefilling.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (batch.empty() && prefilling.empty() && queue_.empty()) return;  // stopping, everything queued has run
        // A job joins when the batch has room and the cache can hold all of it (prompt and max_tokens): the
        // blocks it may need are set aside, so a running sequence never finds the cache full.
        while (!queue_.empty() && static_cast<int64_t>(batch.size() + prefilling.size()) < o_.max_batch) {
          const std::shared_ptr<Job>& job = queue_.front();
          const int64_t need = blocks_for(*job);  // at most the whole cache: --ctx <= --kv-tokens (run_serve)
          if (reserved_ + need > cache_.num_blocks()) break;
          Active a;
          a.job = job;
          queue_.pop_front();
          a.reserved = need;
          reserved_ += need;
          prefilling.push_back(std::move(a));
        }
        // Under the lock that took the jobs off the queue: submit() never sees a job in neither.
        places_taken_ = static_cast<int64_t>(batch.size() + prefilling.size());
      }
      if (!prefilling.empty()) {
        // A job takes its cached prefix when its prompt is next to run, so that jobs admitted together find
        // the blocks the ones before them filled.
        Active& a = prefilling.front();
        if (!a.seq.pool) start(a);
        const int state = prefill_chunk(a);
        if (state != 0) {
          if (state > 0) batch.push_back(std::move(a));
          prefilling.pop_front();
        }
      }
      running_ = static_cast<int64_t>(batch.size());
      running_peak_ = std::max(running_peak_.load(), running_.load());
      if (!batch.empty()) {
        step(batch);
        running_ = static_cast<int64_t>(batch.size());
      }
      places_taken_ = static_cast<int64_t>(batch.size() + prefilling.size());
      kv_free_ = cache_.free_blocks();
      kv_cached_ = cache_.cached_blocks();
    }
  }

  // Blocks of the cache a job may fill: its prompt and max_tokens, within the context.
  int64_t blocks_for(const Job& job) const {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(job.prompt.size()) + job.options.max_new_tokens, o_.ctx);
    return (n + kBlock - 1) / kBlock;
  }

  // A joining job's sequence and generator; the longest cached prefix of its prompt is not run again.
  void start(Active& a) {
    a.gen = Generator(a.job->options.seed);
    a.seq = cache_.new_sequence(o_.ctx);
    const int64_t reuse = cache_.reuse_prefix(a.seq, a.job->prompt);
    metrics_.prefix_reused_tokens += reuse;
  }

  // Runs the next chunk of a's prompt; when the prompt is done, samples the first token. 0: more to run;
  // 1: in the batch from now; -1: the job ended.
  int prefill_chunk(Active& a) {
    llm::Sequence& seq = a.seq;
    const std::vector<int64_t>& prompt = a.job->prompt;
    if (a.prefilled == 0) a.prefilled = static_cast<size_t>(seq.position);
    if (a.job->cancelled.load()) {
      a.reason = "cancelled";
      end(a, "");
      return -1;
    }
    const size_t n = std::min(prompt.size() - a.prefilled, static_cast<size_t>(o_.prefill_chunk));
    const std::vector<int64_t> chunk(prompt.begin() + static_cast<std::ptrdiff_t>(a.prefilled),
                                     prompt.begin() + static_cast<std::ptrdiff_t>(a.prefilled + n));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const Tensor logits = model_.prefill(seq, chunk);
      a.prefilled += n;
      metrics_.prompt_tokens += static_cast<int64_t>(n);
      if (a.prefilled < prompt.size()) {
        add(metrics_.prefill_seconds, seconds_since(t0));
        return 0;
      }
      const int64_t t = model_.sample_first(logits, a.job->options.sampling, &a.gen);
      record_logprob(a, logits, t);
      add(metrics_.prefill_seconds, seconds_since(t0));
      if (accept(a, t)) return 1;
    } catch (const std::exception& e) {
      cache_.clear_prefixes();  // blocks this prompt filled may hold anything
      a.reason = "error";
      end(a, e.what());
      return -1;
    }
    end(a, "");
    return -1;
  }

  // One decode step of every sequence in the batch; the ones that end leave it.
  void step(std::vector<Active>& batch) {
    std::vector<llm::Sequence*> seqs;
    std::vector<int64_t> tokens;
    for (Active& a : batch) {
      seqs.push_back(&a.seq);
      tokens.push_back(a.ids.back());
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<char> more(batch.size(), 0);
    std::string error;
    try {
      const Tensor logits = model_.step(seqs, tokens);
      // The greedy rows' tokens from one argmax and one read back (a draw per row would launch and wait once a
      // row); each greedy sequence's generator still advances by one, as sample() advances it.
      std::vector<int64_t> greedy, chosen(batch.size(), -1);
      for (size_t r = 0; r < batch.size(); ++r)
        if (batch[r].job->options.sampling.temperature == 0.0) greedy.push_back(static_cast<int64_t>(r));
      if (!greedy.empty()) {
        const Tensor rows = greedy.size() == batch.size()
                                ? logits
                                : index_select(logits, 0, from_vector<int64_t>(greedy).to(logits.device()));
        const std::vector<int64_t> best = argmax(rows, 1).to(kCPU).to_vector<int64_t>();
        for (size_t i = 0; i < greedy.size(); ++i) {
          chosen[static_cast<size_t>(greedy[i])] = best[i];
          batch[static_cast<size_t>(greedy[i])].gen.next_offset();
        }
      }
      for (size_t r = 0; r < batch.size(); ++r) {
        Active& a = batch[r];
        const Tensor row = logits.select(0, static_cast<int64_t>(r));
        const int64_t t = chosen[r] >= 0 ? chosen[r] : sample(row, a.job->options.sampling, &a.gen).item<int64_t>();
        record_logprob(a, row, t);
        more[r] = accept(a, t);
      }
    } catch (const std::exception& e) {
      error = e.what();  // every sequence of the step ends with it
    }
    add(metrics_.decode_seconds, seconds_since(t0));
    if (!error.empty()) cache_.clear_prefixes();  // the blocks' contents are not known: reuse none
    std::vector<Active> kept;
    for (size_t r = 0; r < batch.size(); ++r) {
      if (error.empty() && more[r]) kept.push_back(std::move(batch[r]));
      else end(batch[r], error);
    }
    batch.swap(kept);
  }

  // A new token of `a`: its text to the stream (holding back an incomplete UTF-8 sequence and any tail that
  // could still become a stop string); false when the job ends with it.
  bool accept(Active& a, int64_t t) {
    Job& job = *a.job;
    if (job.cancelled.load()) {
      a.reason = "cancelled";
      return false;
    }
    a.ids.push_back(static_cast<int32_t>(t));
    metrics_.generated_tokens++;
    bool go_on = static_cast<int64_t>(a.ids.size()) < job.options.max_new_tokens;
    bool eos = false;
    for (int64_t e : job.options.stop_ids)
      if (e == t) {
        a.reason = "stop";
        go_on = false;
        eos = true;
      }
    detokenize(a, false);
    size_t ready = a.text.size();
    for (const std::string& s : job.stop) {
      const size_t at = a.text.find(s, a.sent > s.size() ? a.sent - s.size() : 0);
      if (at != std::string::npos) {
        a.text.resize(at);
        ready = std::max(at, a.sent);
        a.reason = "stop";
        a.cut = true;
        go_on = false;
      } else {
        for (size_t k = std::min(s.size() - 1, ready); k > 0; --k)
          if (a.text.compare(ready - k, k, s, 0, k) == 0) {
            ready -= k;
            break;
          }
      }
    }
    {
      std::lock_guard<std::mutex> lock(job.mu);
      // The end-of-sequence token is not part of the output, nor are its log-probabilities.
      if (a.logprob && !eos && !a.cut) job.pending_logprobs.push_back(std::move(*a.logprob));
      a.logprob.reset();
      if (ready > a.sent) {
        job.pending += a.text.substr(a.sent, ready - a.sent);
        a.sent = ready;
      }
      job.generated = static_cast<int64_t>(a.ids.size());
    }
    job.cv.notify_all();
    return go_on;
  }

  // Appends the text the tokens since `read` add, unless it ends in an incomplete UTF-8 sequence (the next
  // token may complete it); `final` appends it anyway.
  void detokenize(Active& a, bool final) {
    if (!tok_ || a.read == a.ids.size()) return;
    const std::span<const int32_t> ids(a.ids);
    const std::string before = tok_->decode(ids.subspan(a.prefix, a.read - a.prefix), true);
    const std::string now = tok_->decode(ids.subspan(a.prefix), true);
    const bool incomplete = now.size() >= 3 && now.compare(now.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if (now.size() <= before.size() || (incomplete && !final)) return;
    a.text += now.substr(before.size());
    a.prefix = a.read;
    a.read = a.ids.size();
  }

  // The job is over: the rest of its text, its finish reason, and its blocks back.
  void end(Active& a, const std::string& error) {
    Job& job = *a.job;
    // Its blocks back to the cache (full ones stay cached for later prompts) before the client hears of the end.
    a.seq = llm::Sequence();
    reserved_ -= a.reserved;
    a.reserved = 0;
    kv_free_ = cache_.free_blocks();
    kv_cached_ = cache_.cached_blocks();
    // Its place in the batch too (run() counts the places again after the step): a client that sends its next
    // request as soon as this one's answer arrives finds the place free.
    places_taken_ = std::max<int64_t>(0, places_taken_.load() - 1);
    if (!a.cut) detokenize(a, true);
    if (a.reason == "cancelled") metrics_.cancelled++;
    if (!error.empty()) metrics_.errors++;
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (a.text.size() > a.sent) job.pending += a.text.substr(a.sent);  // the held-back tail (before any stop string)
      job.finish_reason = a.reason;
      job.error = error;
      job.generated = static_cast<int64_t>(a.ids.size());
      job.done = true;
    }
    job.cv.notify_all();
  }

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static void add(std::atomic<double>& x, double v) { x = x.load() + v; }  // one writer: the engine thread

  llm::Model model_;
  std::optional<Tokenizer> tok_;
  std::optional<ChatTemplate> chat_;
  ServeOptions o_;
  Metrics metrics_;
  llm::KVCache cache_;
  int64_t reserved_ = 0;  // blocks set aside for the jobs in the batch (engine thread)
  int64_t kv_blocks_ = 0;
  std::atomic<int64_t> kv_free_{0}, kv_cached_{0};  // the cache's use after the engine's last pass
  std::atomic<int64_t> running_{0}, running_peak_{0};
  // Jobs in the batch or in their prompt's prefill (the places of --max-batch they hold).
  std::atomic<int64_t> places_taken_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// ---- the API --------------------------------------------------------------------------------------------------

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string request_id(const char* prefix) {
  static std::atomic<uint64_t> n{0};
  return str(prefix, std::hex, now_s(), "-", ++n);
}


json usage(const Job& job) {
  const int64_t p = static_cast<int64_t>(job.prompt.size());
  return {{"prompt_tokens", p}, {"completion_tokens", job.generated}, {"total_tokens", p + job.generated}};
}

std::string finish(const std::string& reason) { return reason == "cancelled" ? "length" : reason; }

// ---- logprobs in OpenAI's two shapes ---------------------------------------------------------------------------

std::string token_text(const Tokenizer* tok, int32_t id) {
  return tok ? tok->decode(std::span<const int32_t>(&id, 1), false) : std::to_string(id);
}

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
json chat_logprobs(const std::vector<TokenLogprob>& entries, const Tokenizer* tok) {
  json content = json::array();
  for (const TokenLogprob& e : entries) {
    json top = json::array();
    for (const auto& [id, lp] : e.top) {
      const std::string t = token_text(tok, id);
      top.push_back({{"token", t}, {"logprob", lp}, {"bytes", utf8_bytes(t)}});
    }
    const std::string t = token_text(tok, e.id);
    content.push_back({{"token", t}, {"logprob", e.logprob}, {"bytes", utf8_bytes(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; `offset` is the
// output's length in characters before these tokens (it advances).
json completion_logprobs(const std::vector<TokenLogprob>& entries, const Tokenizer* tok, size_t& offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& e : entries) {
    const std::string t = token_text(tok, e.id);
    json top = json::object();
    for (const auto& [id, lp] : e.top) {
      const std::string tt = token_text(tok, id);
      if (!top.contains(tt)) top[tt] = lp;  // two tokens of one text (partial UTF-8): the likelier one
    }
    tokens.push_back(t);
    lps.push_back(e.logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    for (unsigned char c : t) offset += (c & 0xC0) != 0x80;  // characters (code points), as OpenAI counts
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// Runs the job and answers: one JSON body, or Server-Sent Events as the text arrives.
void respond(Engine& e, const std::shared_ptr<Job>& job, bool chat, bool stream, bool include_usage, const std::string& model_id,
             httplib::Response& res) {
  const std::string id = request_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = now_s();
  const char* object = chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  e.submit(job);
  if (!stream) {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done; });
    if (!job->error.empty()) throw HttpError{500, job->error, "", "server_error"};
    json choice = {{"index", 0}, {"finish_reason", finish(job->finish_reason)}, {"logprobs", nullptr}};
    size_t offset = 0;
    if (job->top_logprobs >= 0)
      choice["logprobs"] = chat ? chat_logprobs(job->pending_logprobs, e.tokenizer())
                                : completion_logprobs(job->pending_logprobs, e.tokenizer(), offset);
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", job->pending}};
    else choice["text"] = job->pending;
    res.set_content(json{{"id", id}, {"object", object}, {"created", created}, {"model", model_id},
                         {"choices", json::array({choice})}, {"usage", usage(*job)}}
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return;
  }
  auto chunk = [=](const json& delta_or_text, const json& reason, const json& logprobs = nullptr) {
    json choice = {{"index", 0}, {"finish_reason", reason}, {"logprobs", logprobs}};
    if (chat) choice["delta"] = delta_or_text;
    else choice["text"] = delta_or_text;
    return json{{"id", id}, {"object", object}, {"created", created}, {"model", model_id}, {"choices", json::array({choice})}};
  };
  auto started = std::make_shared<bool>(false);
  auto offset = std::make_shared<size_t>(0);  // completions' text_offset so far
  auto seen = std::make_shared<int64_t>(0);     // tokens the client has heard of (models without a tokenizer)
  const Tokenizer* tok = e.tokenizer();
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string s = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
          return sink.write(s.data(), s.size());
        };
        if (chat && !*started) {
          *started = true;
          if (!send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
        }
        std::string piece;
        std::vector<TokenLogprob> lps;
        bool done = false, tokens = false;
        {
          // A model without a tokenizer (a preset) has no text: each new token is an empty piece, so that
          // clients still see tokens arrive (kiln bench serve's TTFT and ITL).
          std::unique_lock<std::mutex> lock(job->mu);
          job->cv.wait_for(lock, std::chrono::milliseconds(200), [&] {
            return job->done || !job->pending.empty() || (!tok && job->generated > *seen);
          });
          piece.swap(job->pending);
          lps.swap(job->pending_logprobs);
          done = job->done;
          tokens = !tok && job->generated > *seen && !done;
          *seen = job->generated;
        }
        if (!piece.empty() || !lps.empty() || tokens) {
          json lp = nullptr;
          if (job->top_logprobs >= 0) lp = chat ? chat_logprobs(lps, tok) : completion_logprobs(lps, tok, *offset);
          if (!send(chunk(chat ? json{{"content", piece}} : json(piece), nullptr, lp))) return false;
        }
        if (!sink.is_writable()) return false;
        if (!done) return true;
        if (!job->error.empty()) {
          send(json{{"error", {{"message", job->error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
        } else if (!send(chunk(chat ? json::object() : json(""), finish(job->finish_reason)))) {
          return false;
        }
        if (include_usage) {
          json u = {{"id", id}, {"object", object}, {"created", created}, {"model", model_id}, {"choices", json::array()},
                    {"usage", usage(*job)}};
          if (!send(u)) return false;
        }
        const std::string end = "data: [DONE]\n\n";
        sink.write(end.data(), end.size());
        sink.done();
        return true;
      },
      [job](bool success) {
        // The client went away (or the stream ended): a running job stops at its next token.
        if (!success) job->cancelled = true;
      });
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

// SIGTERM and SIGINT: the handler only posts a semaphore (async-signal-safe) that one thread waits on. The signals
// are blocked in the threads run_serve starts (HTTP workers, the engine), but libraries may have started threads
// before it (a BLAS thread pool, the CUDA driver's), and the kernel may deliver the signal to any of those: a
// handler, unlike sigwait, catches it there too instead of the default action ending the process.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
sem_t stop_semaphore;
volatile sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  stop_signal = sig;
  sem_post(&stop_semaphore);
}

}  // namespace

int run_serve(const ServeOptions& options, const LlmOptions& model_options) {
  ServeOptions o = options;
  if (o.kv_tokens > 0 && o.kv_tokens < o.ctx) {  // a request can use at most the whole cache
    std::cerr << "kiln serve: --ctx " << o.ctx << " is more than --kv-tokens " << o.kv_tokens << ": using --ctx "
              << o.kv_tokens << "\n";
    o.ctx = o.kv_tokens;
  }
  // Before any thread starts, so that every thread inherits the mask.
  const sigset_t signals = stop_signals();
  sem_init(&stop_semaphore, 0, 0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const Device dev = device_of(model_options.device);
  std::optional<Tokenizer> tok;
  std::optional<ChatTemplate> chat;
  std::string model_id = model_options.preset;
  if (!model_options.model.empty()) {
    model_id = std::filesystem::path(model_options.model).filename().string();
    if (model_id.empty()) model_id = std::filesystem::path(model_options.model).parent_path().filename().string();
    tok = model_tokenizer(model_options.model);
    try {
      chat = ChatTemplate::from_model_dir(model_options.model);
    } catch (const Error& e) {
      std::cerr << "kiln serve: no chat template (" << e.what() << "): /v1/chat/completions is off\n";
    }
  }
  Engine engine(open_model_for(model_options, dev, o.ctx), std::move(tok), std::move(chat), o);

  httplib::Server svr;
  // A streamed request holds a worker thread until its last token: one for every sequence that may run and every
  // request that may wait, and a few for /health, /metrics and requests being refused. (cpp-httplib's default,
  // the core count less one, would cap the running batch there.)
  const size_t workers = static_cast<size_t>(o.max_batch + o.max_queue + 8);
  svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  svr.set_payload_max_length(o.max_body);
  // A client that stalls mid-request (slow-loris) holds a worker thread this long at most.
  svr.set_read_timeout(5, 0);
  svr.set_write_timeout(10, 0);
  svr.set_keep_alive_timeout(5);

  // Every handler: the API key, then the work; HttpError and kiln::Error become OpenAI-shaped errors.
  auto guarded = [&](auto&& fn) {
    return [&, fn](const httplib::Request& req, httplib::Response& res) {
      engine.metrics().requests++;
      try {
        if (!o.api_key.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          const std::string want = "Bearer " + o.api_key;
          if (!equal_constant_time(auth, want))
            throw HttpError{401, "a valid API key is required (Authorization: Bearer KEY)", "", "authentication_error"};
        }
        fn(req, res);
      } catch (const HttpError& e) {
        engine.metrics().errors++;
        send_error(res, e);
      } catch (const Error& e) {
        engine.metrics().errors++;
        send_error(res, bad_request(e.what()));
      } catch (const std::exception& e) {
        engine.metrics().errors++;
        send_error(res, HttpError{500, e.what(), "", "server_error"});
      }
    };
  };

  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/v1/models", guarded([&](const httplib::Request&, httplib::Response& res) {
    const json m = {{"id", model_id}, {"object", "model"}, {"created", now_s()}, {"owned_by", "kiln"},
                    {"max_context", engine.model().max_context()}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  }));
  // What request validation needs of the model (serve_request.h).
  ServedModel served;
  served.id = model_id;
  served.vocab_size = engine.model().config().vocab_size;
  served.max_context = engine.model().max_context();
  served.eos_token_ids = engine.model().config().eos_token_ids;
  served.tokenizer = engine.tokenizer();
  served.chat = engine.chat();
  // A request's fields into a job (its ids, sampling, stop strings, logprobs and stream flags), then the answer.
  auto generate = [&](const httplib::Request& req, httplib::Response& res, bool chat) {
    const json j = parse_body(req.body);
    auto job = std::make_shared<Job>();
    static_cast<GenerationRequest&>(*job) = chat ? chat_request(j, served) : completion_request(j, served);
    respond(engine, job, chat, job->stream, job->include_usage, model_id, res);
  };
  svr.Post("/v1/completions", guarded([&](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); }));
  svr.Post("/v1/chat/completions",
           guarded([&](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); }));
  svr.Post("/tokenize", guarded([&](const httplib::Request& req, httplib::Response& res) {
    const json j = parse_body(req.body);
    const char* key = j.contains("content") ? "content" : "prompt";
    if (!j.contains(key) || !j[key].is_string()) throw bad_request("'content' must be a string", "content");
    if (!engine.tokenizer()) throw bad_request("this model has no tokenizer");
    json ids = json::array();
    for (int32_t t : engine.tokenizer()->encode(j[key].get<std::string>(), boolean(j, "add_special", false))) ids.push_back(t);
    res.set_content(json{{"tokens", ids}}.dump(), "application/json");
  }));
  svr.Post("/detokenize", guarded([&](const httplib::Request& req, httplib::Response& res) {
    const json j = parse_body(req.body);
    if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens");
    if (!engine.tokenizer()) throw bad_request("this model has no tokenizer");
    std::vector<int32_t> ids;
    const int64_t vocab = engine.tokenizer()->vocab_size();
    for (const json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        throw bad_request(str("'tokens' must hold token ids in [0, ", vocab, ")"), "tokens");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    const bool skip = boolean(j, "skip_special_tokens", false);
    res.set_content(json{{"content", engine.tokenizer()->decode(ids, skip)}}.dump(), "application/json");
  }));
  svr.Get("/metrics", guarded([&](const httplib::Request&, httplib::Response& res) {
    Metrics& m = engine.metrics();
    std::string s;
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      s += str("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", v, "\n");
    };
    metric("kiln_requests_total", "counter", "HTTP requests received", double(m.requests.load()));
    metric("kiln_request_errors_total", "counter", "Requests answered with an error", double(m.errors.load()));
    metric("kiln_requests_cancelled_total", "counter", "Requests whose client went away", double(m.cancelled.load()));
    metric("kiln_prompt_tokens_total", "counter", "Prompt tokens run through the model", double(m.prompt_tokens.load()));
    metric("kiln_prefix_reused_tokens_total", "counter", "Prompt tokens found in the prefix cache and not run again",
           double(m.prefix_reused_tokens.load()));
    metric("kiln_generation_tokens_total", "counter", "Tokens generated", double(m.generated_tokens.load()));
    metric("kiln_queue_length", "gauge", "Requests waiting for the engine", double(engine.queued()));
    metric("kiln_batch_running", "gauge", "Sequences in the running batch", double(engine.running()));
    metric("kiln_batch_running_max", "gauge", "The most sequences decoded together so far", double(engine.running_peak()));
    const Engine::CacheUse kv = engine.cache_use();
    metric("kiln_kv_cache_blocks", "gauge", "Blocks of the paged KV cache (16 positions each)", double(kv.blocks));
    metric("kiln_kv_cache_blocks_free", "gauge", "Blocks no sequence holds (cached prefixes included)", double(kv.free));
    metric("kiln_kv_cache_blocks_cached", "gauge", "Blocks no sequence holds that keep a cached prefix", double(kv.cached));
    const double pf = m.prefill_seconds.load(), dc = m.decode_seconds.load();
    metric("kiln_prefill_seconds_total", "counter", "Time spent in prefill", pf);
    metric("kiln_decode_seconds_total", "counter", "Time spent decoding", dc);
    if (dev.is_cuda()) {
      const MemoryStats ms = memory_stats(dev);
      metric("kiln_memory_tensors_bytes", "gauge", "Bytes in live tensors", double(ms.allocated));
      metric("kiln_memory_reserved_bytes", "gauge", "Bytes the caching allocator holds", double(ms.reserved));
      metric("kiln_memory_driver_bytes", "gauge", "Device memory in use (driver)", double(ms.driver_used));
    }
    res.set_content(s, "text/plain; version=0.0.4");
  }));
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const char* message = res.status == 413 ? "the request body is too large"
                          : res.status == 404 ? "no such endpoint"
                                              : "the request could not be served";
    send_error(res, HttpError{res.status, message, "", "invalid_request_error"});
  });

  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library): more
  // clients than that connecting at once overflowed the kernel's accept queue (at 128 concurrent streams, 40 of
  // 256 requests failed with "connection failed: Read"). The listening socket is caught as it is made, and
  // listened on again with the system's maximum once bound (Linux takes a second listen() as the new backlog).
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = static_cast<int>(sock);
  });
  // Port 0: any free port (the line below says which).
  const int port = o.port == 0 ? svr.bind_to_any_port(o.host.c_str()) : (svr.bind_to_port(o.host.c_str(), o.port) ? o.port : -1);
  if (port <= 0)
    throw Error(str("serve: cannot listen on ", o.host, ":", o.port, " (in use, or not an address of this machine)"));
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
    std::cerr << "kiln serve: could not raise the listen backlog (" << std::strerror(errno) << "); continuing\n";
  std::atomic<bool> listening{true};
  std::thread signal_thread([&] {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);  // this thread takes them when no library thread does
    while (sem_wait(&stop_semaphore) != 0 && errno == EINTR) {
    }
    if (listening) std::cerr << "kiln serve: " << (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << "\n";
    svr.stop();
  });
  const Engine::CacheUse kv = engine.cache_use();
  std::cerr << "kiln serve: " << model_id << " on " << dev.str() << ", context " << engine.model().max_context()
            << " tokens, KV cache " << kv.blocks << " blocks of 16 tokens (" << engine.cache_bytes() / (1 << 20)
            << " MiB); listening on http://" << o.host << ":" << port << (o.api_key.empty() ? "" : " (API key required)")
            << "\n"
            << std::flush;
  svr.listen_after_bind();
  listening = false;
  sem_post(&stop_semaphore);  // wakes the signal thread if no signal came
  signal_thread.join();
  std::cerr << "kiln serve: stopping; finishing the queued requests\n";
  return 0;  // the engine's destructor runs what is queued, then joins
}

}  // namespace kiln::cli
