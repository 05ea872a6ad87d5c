// The engine from Python: kiln.Tokenizer, kiln.Model (from_pretrained, from_preset, generate, logits) and
// chat prompts. Generation runs with the GIL released; Ctrl-C stops it between tokens. A streamed
// generation runs on a worker thread that hands tokens to the Python iterator as they are sampled.
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "kiln/gguf.h"
#include "kiln/llm/gguf_model.h"
#include "kiln/chat.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/model.h"
#include "kiln/tokenizer.h"
#include "kiln_py.h"

namespace kiln::py {

namespace {

using llm::Model;

// A model and what generating text from it needs.
struct PyModel {
  std::unique_ptr<Model> model;
  std::shared_ptr<Tokenizer> tokenizer;         // null for a preset (random weights)
  std::optional<ChatTemplate> chat;             // when the checkpoint has a known chat format
  std::mutex busy;                              // one generation at a time
};

// Text pieces of a growing id list, holding back an incomplete UTF-8 sequence (decoded as U+FFFD).
struct TextStream {
  const Tokenizer* tok;
  std::vector<int32_t> ids;
  std::string printed;
  std::string push(int64_t id, bool final) {
    if (id >= 0) ids.push_back(static_cast<int32_t>(id));
    const std::string text = tok->decode(ids, true);
    const bool partial = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if ((partial && !final) || text.size() < printed.size() || text.compare(0, printed.size(), printed) != 0) return {};
    std::string piece = text.substr(printed.size());
    printed = text;
    return piece;
  }
};

struct Request {
  std::vector<int64_t> prompt;
  llm::GenerateOptions options;
  bool text = false;  // the prompt was text: return text
  PyModel* draft = nullptr;  // speculative decoding's draft model (its Python object kept alive by the caller)
};

// Both models' locks (the draft's too, when there is one), taken together so that two generations that use
// each other's model as a draft cannot deadlock.
struct ModelLocks {
  ModelLocks(PyModel& m, PyModel* draft) : a(m.busy, std::defer_lock) {
    if (draft) {
      b = std::unique_lock<std::mutex>(draft->busy, std::defer_lock);
      std::lock(a, b);
    } else {
      a.lock();
    }
  }
  void unlock() {
    if (a.owns_lock()) a.unlock();
    if (b.owns_lock()) b.unlock();
  }
  std::unique_lock<std::mutex> a, b;
};

Request make_request(PyModel& m, nb::handle prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
                     double top_p, double min_p, uint64_t seed, bool ignore_eos, std::optional<std::vector<int64_t>> stop,
                     int64_t lookup, PyModel* draft, int64_t num_draft) {
  Request r;
  KILN_CHECK(draft != &m, "generate: the draft model must be another model than the one it drafts for");
  r.draft = draft;
  r.options.speculative.lookup = lookup;
  r.options.speculative.draft = draft ? draft->model.get() : nullptr;
  r.options.speculative.num_draft = num_draft;
  if (nb::isinstance<nb::str>(prompt) || nb::isinstance<nb::list>(prompt) && nb::len(prompt) > 0 &&
                                             nb::isinstance<nb::dict>(nb::borrow<nb::list>(prompt)[0])) {
    if (!m.tokenizer) throw Error("generate: this model has no tokenizer (a preset): give the prompt as token ids");
    std::string text;
    if (nb::isinstance<nb::str>(prompt)) {
      text = nb::cast<std::string>(prompt);
    } else {
      // A chat: [{"role": ..., "content": ...}, ...] in the checkpoint's chat format.
      if (!m.chat) throw Error("generate: this checkpoint has no chat template kiln renders (ChatML or Llama 3)");
      nb::module_ json = nb::module_::import_("json");
      const std::string messages = nb::cast<std::string>(json.attr("dumps")(prompt));
      text = m.chat->render(parse_chat_messages(messages, "messages"));
    }
    // A chat prompt holds its own special tokens (Llama 3's <|begin_of_text|>); plain text gets the
    // tokenizer's (as `kiln generate` does).
    const bool chat = !nb::isinstance<nb::str>(prompt);
    const auto ids = m.tokenizer->encode(text, !chat);
    r.prompt.assign(ids.begin(), ids.end());
    r.text = true;
  } else {
    try {
      r.prompt = nb::cast<std::vector<int64_t>>(prompt);
    } catch (const nb::cast_error&) {
      throw nb::type_error("generate: prompt must be a str, a list of token ids, or a list of chat messages");
    }
  }
  KILN_CHECK(!r.prompt.empty(), "generate: the prompt is empty");
  r.options.max_new_tokens = max_new_tokens;
  r.options.sampling = SamplingParams{temperature, top_k, top_p, min_p};
  r.options.seed = seed;
  if (!ignore_eos) r.options.stop_ids = m.model->config().eos_token_ids;
  if (stop) r.options.stop_ids.insert(r.options.stop_ids.end(), stop->begin(), stop->end());
  return r;
}

// Between tokens, with the GIL taken briefly: true when Python has a pending signal (Ctrl-C).
bool interrupted() {
  nb::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

// A streamed generation: the model decodes on a worker thread; __next__ waits (without the GIL) for the
// next token. Dropping the iterator, or Ctrl-C, stops the worker after its current token.
class Streamer {
 public:
  Streamer(nb::object owner, nb::object draft_owner, PyModel& m, Request r)
      : owner_(std::move(owner)), draft_owner_(std::move(draft_owner)), m_(m), text_{m.tokenizer.get(), {}, {}},
        as_text_(r.text) {
    {
      nb::gil_scoped_release release;  // another generation may hold the model and need the GIL to finish
      locks_.emplace(m, r.draft);
    }
    r.options.on_token = [this](int64_t t) {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(t);
      cv_.notify_one();
      return !cancel_;
    };
    worker_ = std::thread([this, r = std::move(r)]() mutable {
      try {
        llm::generate(*m_.model, r.prompt, r.options);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu_);
        error_ = e.what();
      }
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
      cv_.notify_one();
    });
  }
  ~Streamer() { stop(); }

  // Ends the generation after its current token and frees the model for the next one.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      cancel_ = true;
    }
    if (worker_.joinable()) {
      nb::gil_scoped_release release;
      worker_.join();
    }
    if (locks_) locks_->unlock();
  }

  nb::object next() {
    for (;;) {
      int64_t token = -1;
      bool got = false, finished = false;
      {
        nb::gil_scoped_release release;
        std::unique_lock<std::mutex> g(mu_);
        // At most 100 ms without looking for Ctrl-C.
        cv_.wait_for(g, std::chrono::milliseconds(100), [&] { return !queue_.empty() || done_; });
        if (!queue_.empty()) {
          token = queue_.front();
          queue_.pop_front();
          got = true;
        } else {
          finished = done_;
        }
      }
      if (PyErr_CheckSignals() != 0) {
        stop();
        throw nb::python_error();
      }
      if (finished) {
        stop();
        if (!error_.empty()) throw Error(error_);
        if (as_text_ && !flushed_) {
          flushed_ = true;
          std::string rest = text_.push(-1, true);
          if (!rest.empty()) return nb::str(rest.data(), rest.size());
        }
        throw nb::stop_iteration();
      }
      if (!got) continue;
      if (!as_text_) return nb::int_(token);
      std::string piece = text_.push(token, false);
      if (!piece.empty()) return nb::str(piece.data(), piece.size());
    }
  }

 private:
  nb::object owner_;        // the Python Model: alive while this stream is
  nb::object draft_owner_;  // and its draft model, if any
  PyModel& m_;
  std::optional<ModelLocks> locks_;
  TextStream text_;
  bool as_text_, flushed_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> queue_;
  bool done_ = false, cancel_ = false;
  std::string error_;
  std::thread worker_;
};

nb::object generate(nb::pointer_and_handle<PyModel> self, nb::handle prompt, int64_t max_new_tokens, double temperature,
                    int64_t top_k, double top_p, double min_p, uint64_t seed, bool ignore_eos,
                    std::optional<std::vector<int64_t>> stop, bool stream, int64_t lookup, nb::handle draft_h,
                    int64_t num_draft) {
  PyModel& m = *self.p;
  PyModel* draft = draft_h.is_none() ? nullptr : nb::cast<PyModel*>(draft_h);
  Request r = make_request(m, prompt, max_new_tokens, temperature, top_k, top_p, min_p, seed, ignore_eos, std::move(stop),
                           lookup, draft, num_draft);
  if (stream)
    return nb::cast(new Streamer(nb::borrow(self.h), nb::borrow(draft_h), m, std::move(r)), nb::rv_policy::take_ownership);
  bool stopped = false;
  r.options.on_token = [&](int64_t) {
    if (interrupted()) stopped = true;
    return !stopped;
  };
  std::vector<int64_t> out;
  {
    nb::gil_scoped_release release;
    ModelLocks locks(m, r.draft);
    out = llm::generate(*m.model, r.prompt, r.options);
  }
  if (stopped) throw nb::python_error();  // the KeyboardInterrupt PyErr_CheckSignals set
  if (!r.text) return nb::cast(out);
  const std::vector<int32_t> ids(out.begin(), out.end());
  return nb::cast(m.tokenizer->decode(ids, true));
}

llm::ModelOptions model_options(std::optional<Device> device, std::optional<DType> dtype, int64_t max_context,
                                bool use_graph) {
  llm::ModelOptions o;
  o.device = device.value_or(cuda_available() ? cuda_device(0) : kCPU);
  o.dtype = dtype;
  o.max_context = max_context;
  o.use_graph = use_graph;
  return o;
}

nb::dict config_dict(const llm::ModelConfig& c) {
  nb::dict d;
  d["architecture"] = c.architecture;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_hidden_layers"] = c.num_layers;
  d["num_attention_heads"] = c.num_heads;
  d["num_key_value_heads"] = c.num_kv_heads;
  d["head_dim"] = c.head_dim;
  d["vocab_size"] = c.vocab_size;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["num_experts"] = c.num_experts;
  d["num_experts_per_tok"] = c.num_experts_per_tok;
  d["eos_token_id"] = nb::cast(c.eos_token_ids);
  return d;
}

}  // namespace

void bind_llm(nb::module_& m) {
  nb::class_<Tokenizer>(m, "Tokenizer", "A Hugging Face tokenizer.json (byte-level BPE), encoding and decoding as "
                                        "the tokenizers library does.")
      .def_static("from_file", &Tokenizer::from_file, nb::arg("path"), release_gil())
      .def_static("from_pretrained", &Tokenizer::from_model_dir, nb::arg("model_dir"), release_gil(),
                  "DIR/tokenizer.json of a model directory.")
      .def_static("from_str", [](std::string_view json) { return Tokenizer::from_json(json); }, nb::arg("json"),
                  release_gil())
      .def("encode", [](const Tokenizer& t, std::string_view text, bool special) { return t.encode(text, special); },
           nb::arg("text"), nb::arg("add_special_tokens") = true, release_gil())
      .def("decode", [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) { return t.decode(ids, skip); },
           nb::arg("ids"), nb::arg("skip_special_tokens") = false, release_gil())
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, nb::arg("token"))
      .def("id_to_token", &Tokenizer::id_to_token, nb::arg("id"))
      .def("is_special", &Tokenizer::is_special, nb::arg("id"));

  m.def("write_gguf", &llm::write_gguf_model, nb::arg("model_dir"), nb::arg("path"), nb::arg("type") = "q8_0", release_gil(),
        "Writes a Hugging Face checkpoint directory (f32/f16/bf16; qwen3, qwen3moe, llama) as a GGUF file in llama.cpp's "
        "layout with its tokenizer and chat template; type f32, f16, bf16, q8_0, q4_0 or q4_k. Returns the tensors "
        "written per ggml type.");

  m.def("apply_chat_template", [](nb::handle messages, const std::string& model_dir, bool add_generation_prompt) {
    nb::module_ json = nb::module_::import_("json");
    const std::string text = nb::cast<std::string>(json.attr("dumps")(messages));
    return ChatTemplate::from_model_dir(model_dir).render(parse_chat_messages(text, "messages"), add_generation_prompt);
  }, nb::arg("messages"), nb::arg("model_dir"), nb::arg("add_generation_prompt") = true,
     "The prompt text for OpenAI-style messages in a checkpoint's chat format (ChatML or Llama 3).");

  nb::class_<Streamer>(m, "_GenerationStream")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &Streamer::next)
      .def("close", &Streamer::stop, "Stops the generation after its current token.");

  nb::class_<PyModel>(m, "Model", "A decoder-only LLM (Qwen3, Qwen3-MoE, Llama) on the CPU or a CUDA device.")
      .def_static("from_pretrained", [](const std::string& dir, std::optional<Device> device, std::optional<DType> dtype,
                                        int64_t max_context, bool use_graph) {
        auto pm = std::make_unique<PyModel>();
        {
          nb::gil_scoped_release release;
          pm->model = std::make_unique<Model>(llm::load_model(dir, model_options(device, dtype, max_context, use_graph)));
          std::error_code ec;
          const bool gguf = is_gguf_file(dir);
          if (gguf ? GgufFile::open(dir).metadata().count("tokenizer.ggml.model") != 0
                   : std::filesystem::exists(dir + "/tokenizer.json", ec))
            pm->tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_model_dir(dir));
          try {
            pm->chat = ChatTemplate::from_model_dir(dir);
          } catch (const Error&) {
            // no chat format: chat prompts are refused when given
          }
        }
        return pm.release();
      }, nb::arg("model_dir"), nb::kw_only(), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(),
         nb::arg("max_context") = 4096, nb::arg("use_graph") = true, nb::rv_policy::take_ownership,
         "Loads a Hugging Face directory (config.json, safetensors, tokenizer.json) or a GGUF file (llama, qwen3, "
         "qwen3moe; its Q8_0, Q4_0 and Q4_K layers and experts kept in their blocks, Q5_K and Q6_K ones on the CPU, "
         "docs/quantization.md). device defaults to CUDA when available; dtype to bfloat16 on CUDA and float32 "
         "on the CPU (FP8 weights stay FP8).")
      .def_static("from_preset", [](const std::string& name, std::optional<Device> device, std::optional<DType> dtype,
                                    int64_t max_context, uint64_t seed) {
        auto pm = std::make_unique<PyModel>();
        nb::gil_scoped_release release;
        const llm::ModelOptions o = model_options(device, dtype, max_context, true);
        const DType dt = o.dtype.value_or(o.device.is_cuda() ? DType::BF16 : DType::F32);
        const llm::ModelConfig c = llm::preset_config(name);
        pm->model = std::make_unique<Model>(c, llm::random_weights(c, o.device, dt, seed), o);
        return pm.release();
      }, nb::arg("name"), nb::kw_only(), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(),
         nb::arg("max_context") = 4096, nb::arg("seed") = 0, nb::rv_policy::take_ownership,
         "Random weights at a known model's shapes (qwen3-0.6b, qwen3-8b, qwen3-30b-a3b, llama-3-8b, each also -fp8): "
         "for timing; its text is noise and it has no tokenizer.")
      .def_prop_ro("tokenizer", [](const PyModel& m) -> nb::object {
        if (!m.tokenizer) return nb::none();
        return nb::cast(m.tokenizer.get(), nb::rv_policy::reference);
      }, nb::keep_alive<0, 1>())
      .def_prop_ro("config", [](const PyModel& m) { return config_dict(m.model->config()); })
      .def_prop_ro("device", [](const PyModel& m) { return m.model->device(); })
      .def_prop_ro("dtype", [](const PyModel& m) { return m.model->dtype(); })
      .def_prop_ro("max_context", [](const PyModel& m) { return m.model->max_context(); })
      .def("generate", &generate, nb::arg("prompt"), nb::kw_only(), nb::arg("max_new_tokens") = 128,
           nb::arg("temperature") = 0.7, nb::arg("top_k") = 20, nb::arg("top_p") = 0.95, nb::arg("min_p") = 0.0,
           nb::arg("seed") = 0, nb::arg("ignore_eos") = false, nb::arg("stop") = nb::none(), nb::arg("stream") = false,
           nb::arg("lookup") = 0, nb::arg("draft") = nb::none(), nb::arg("num_draft") = 4,
           "Generates after `prompt`: a str (returns the text), a list of token ids (returns the ids), or chat "
           "messages [{'role', 'content'}] in the checkpoint's chat format (returns the text). Sampling as `kiln "
           "generate` (temperature 0: greedy); generation ends at an end-of-sequence id unless ignore_eos, or at "
           "an id in `stop`. stream=True returns an iterator of text pieces (or ids) as they are decoded. "
           "Speculative decoding (exact: greedy output unchanged, sampled output with the model's distribution): "
           "lookup=N drafts from the prompt (the tokens after the latest earlier occurrence of the last N tokens), "
           "draft=Model (another kiln.Model with the same vocabulary) drafts by decoding; num_draft tokens per step.")
      .def("logits", [](PyModel& m, const std::vector<int64_t>& ids) {
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> g(m.busy);
        m.model->reset();
        return m.model->prefill(ids, true).cpu();
      }, nb::arg("ids"), "f32 logits [len(ids), vocab] of every position of `ids` (the cache is reset first).")
      .def("reset", [](PyModel& m) { m.model->reset(); }, "Clears the KV cache.");
}

}  // namespace kiln::py
