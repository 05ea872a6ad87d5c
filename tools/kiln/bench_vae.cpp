// `kiln bench vae`: a tiled causal 3-D convolutional video decoder shaped like a current video VAE's (Wan 2.x:
// 16 latent channels, 8x spatial and 4x temporal upsampling, causal 3x3x3 convolutions each after an explicit
// pad, group norm, SiLU, trilinear upsampling), with random weights. The latent is decoded tile by tile in
// space and a latent frame at a time, each causal convolution carrying its last two input frames from one
// chunk to the next (as the real decoders do), into one output video tensor on the device.
//
// It prints frames/s and the peaks of the three memory figures (tensors, allocator reserved, driver) on CUDA,
// the peak resident set on the CPU, and, on CUDA, the PSNR of the first tile against the same decoder on the
// CPU with the same weights.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"

namespace kiln::cli {

namespace {

struct Preset {
  const char* name;
  std::vector<int64_t> dims;  // channels of each stage; an upsampling (spatial x2) between stages
  std::vector<int64_t> time_up;  // temporal factor of each upsampling
  int64_t frames, height, width;  // the latent
  int64_t tile;
};

// wan: 81 frames of 1280 x 720 (latent 21 x 90 x 160), Wan 2.1's decoder widths; small: for a CPU run in seconds.
const Preset kPresets[] = {
    {"wan", {384, 192, 96, 96}, {2, 2, 1}, 21, 90, 160, 32},
    {"small", {32, 16, 16, 8}, {2, 2, 1}, 3, 12, 16, 8},
};

struct Conv {
  Tensor w, b;
};

// Random weights, scaled by 1 / sqrt(fan in) so activations stay O(1); made on the CPU from one seed so
// every device decodes with the same numbers.
Conv make_conv(int64_t cin, int64_t cout, Generator& g) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(cin * 27));
  return {mul(randn({cout, cin, 3, 3, 3}, DType::F32, kCPU, &g), Scalar(scale)),
          mul(randn({cout}, DType::F32, kCPU, &g), Scalar(0.1))};
}

struct ResBlock {
  Conv a, b;
};

struct Decoder {
  Conv in;
  std::vector<ResBlock> blocks;  // one per stage
  std::vector<Conv> up;          // after each upsampling
  Conv out;
  const Preset* p = nullptr;

  Decoder to(Device dev, DType dt) const {
    auto mv = [&](const Conv& c) { return Conv{c.w.to(dev, dt), c.b.to(dev, dt)}; };
    Decoder d;
    d.p = p;
    d.in = mv(in);
    for (const auto& r : blocks) d.blocks.push_back({mv(r.a), mv(r.b)});
    for (const auto& c : up) d.up.push_back(mv(c));
    d.out = mv(out);
    return d;
  }
};

Decoder make_decoder(const Preset& p, uint64_t seed) {
  Generator g(seed);
  Decoder d;
  d.p = &p;
  d.in = make_conv(16, p.dims[0], g);
  for (size_t s = 0; s < p.dims.size(); ++s) {
    d.blocks.push_back({make_conv(p.dims[s], p.dims[s], g), make_conv(p.dims[s], p.dims[s], g)});
    if (s + 1 < p.dims.size()) d.up.push_back(make_conv(p.dims[s], p.dims[s + 1], g));
  }
  d.out = make_conv(p.dims.back(), 3, g);
  return d;
}

// One decode of a latent tile, chunk by chunk in time. Each causal convolution keeps its last two input frames.
class TileDecoder {
 public:
  explicit TileDecoder(const Decoder& d) : d_(d) {}

  Tensor chunk(const Tensor& z) {
    next_ = 0;
    Tensor x = conv(z, d_.in);
    for (size_t s = 0; s < d_.blocks.size(); ++s) {
      x = res(x, d_.blocks[s]);
      if (s + 1 < d_.blocks.size()) {
        const int64_t t = x.size(2) * d_.p->time_up[s];
        x = interpolate(x, Shape{t, x.size(3) * 2, x.size(4) * 2}, std::nullopt, "trilinear", false);
        x = conv(x, d_.up[s]);
      }
    }
    return conv(silu(norm(x)), d_.out);
  }

 private:
  Tensor norm(const Tensor& x) const { return group_norm(x, std::min<int64_t>(32, x.size(1))); }

  Tensor res(const Tensor& x, const ResBlock& r) { return add(x, conv(silu(norm(conv(silu(norm(x)), r.a))), r.b)); }

  // A causal 3x3x3 convolution: the previous chunk's last two frames (zeros before the first) in front in
  // time, then the explicit spatial pad, then a convolution without padding.
  Tensor conv(const Tensor& x, const Conv& c) {
    if (next_ >= caches_.size()) caches_.emplace_back();
    Tensor& cache = caches_[next_++];
    Tensor seq = cache.defined() ? cat({cache, x}, 2) : pad(x, {0, 0, 0, 0, 2, 0});
    cache = seq.narrow(2, seq.size(2) - 2, 2).clone();
    return kiln::conv(pad(seq, {1, 1, 1, 1}), c.w, c.b);
  }

  const Decoder& d_;
  std::vector<Tensor> caches_;
  size_t next_ = 0;
};

int64_t out_frames(const Preset& p, int64_t latent_frames) {
  int64_t f = latent_frames;
  for (int64_t u : p.time_up) f *= u;
  return f;
}

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

// PSNR of `got` against `ref` over the reference's value range, in dB.
double psnr(const Tensor& got, const Tensor& ref) {
  const Tensor r = ref.to(DType::F64), g = got.cpu().to(DType::F64);
  const double mse = mean(square(sub(g, r))).item<double>();
  const double range = sub(amax(r), amin(r)).item<double>();
  return mse == 0 ? INFINITY : 10.0 * std::log10(range * range / mse);
}

}  // namespace

int run_bench_vae(const BenchVaeOptions& o) {
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (o.preset == p.name) preset = &p;
  if (!preset) throw Error(str("bench vae: unknown preset '", o.preset, "' (wan, small)"));
  Preset p = *preset;
  if (o.frames > 0) p.frames = o.frames;
  if (o.tile > 0) p.tile = o.tile;
  const Device dev = o.device == "auto" ? (cuda_available() ? cuda_device() : kCPU) : Device::parse(o.device);
  const DType dt = parse_dtype(o.dtype);
  KILN_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, "bench vae: --dtype must be f32, bf16 or f16");
  const Decoder host = make_decoder(p, o.seed);
  const Decoder model = host.to(dev, dt);
  const int64_t scale = int64_t{1} << (p.dims.size() - 1);
  const int64_t frames = out_frames(p, p.frames);
  std::printf("bench vae: preset %s on %s, %s; latent 16 x %lld x %lld x %lld -> video 3 x %lld x %lld x %lld, "
              "tiles of %lld x %lld latent pixels\n",
              p.name, dev.str().c_str(), dtype_name(dt), (long long)p.frames, (long long)p.height, (long long)p.width,
              (long long)frames, (long long)(p.height * scale), (long long)(p.width * scale), (long long)p.tile,
              (long long)p.tile);
  Generator g(o.seed + 1);
  const Tensor latent = randn({1, 16, p.frames, p.height, p.width}, DType::F32, kCPU, &g);
  const Tensor z_dev = latent.to(dev, dt);

  // The whole decode: every tile, every latent frame, into one output video.
  auto decode = [&](const Decoder& d, const Tensor& z, int64_t tiles_max) {
    Tensor video = empty({1, 3, frames, p.height * scale, p.width * scale}, z.dtype(), z.device());
    int64_t tiles = 0;
    for (int64_t h0 = 0; h0 < p.height && tiles < tiles_max; h0 += p.tile)
      for (int64_t w0 = 0; w0 < p.width && tiles < tiles_max; w0 += p.tile, ++tiles) {
        const int64_t th = std::min(p.tile, p.height - h0), tw = std::min(p.tile, p.width - w0);
        TileDecoder td(d);
        int64_t f0 = 0;
        for (int64_t t = 0; t < p.frames; ++t) {
          Tensor out = td.chunk(z.narrow(2, t, 1).narrow(3, h0, th).narrow(4, w0, tw));
          video.narrow(2, f0, out.size(2)).narrow(3, h0 * scale, th * scale).narrow(4, w0 * scale, tw * scale).copy_(out);
          f0 += out.size(2);
        }
      }
    return video;
  };

  if (dev.is_cuda()) {
    synchronize(dev);
    reset_peak_memory_stats(dev);
  }
  const auto t0 = std::chrono::steady_clock::now();
  Tensor video = decode(model, z_dev, INT64_MAX);
  if (dev.is_cuda()) synchronize(dev);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json j = {{"preset", p.name},      {"device", dev.str()},           {"dtype", dtype_name(dt)},
                      {"frames", frames},      {"height", p.height * scale},    {"width", p.width * scale},
                      {"seconds", s},          {"frames_per_s", frames / s}};
  std::printf("decoded %lld frames in %.2f s: %.2f frames/s\n", (long long)frames, s, frames / s);
  if (dev.is_cuda()) {
    const MemoryStats m = memory_stats(dev);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::printf("peak memory: tensors %.2f GiB, allocator reserved %.2f GiB, driver %.2f GiB (driver / reserved %.2f)\n",
                m.allocated_peak / gib, m.reserved_peak / gib, m.driver_used_peak / gib,
                m.reserved_peak ? double(m.driver_used_peak) / double(m.reserved_peak) : 0.0);
    j["peak_tensors_bytes"] = m.allocated_peak;
    j["peak_reserved_bytes"] = m.reserved_peak;
    j["peak_driver_bytes"] = m.driver_used_peak;
    // The first tile on the CPU in f32 with the same weights: the reference of the GPU's output.
    if (o.check) {
      const Tensor ref = [&] {
        TileDecoder td(host);
        std::vector<Tensor> outs;
        const Tensor zt = latent.narrow(3, 0, std::min(p.tile, p.height)).narrow(4, 0, std::min(p.tile, p.width));
        for (int64_t t = 0; t < std::min<int64_t>(p.frames, o.check_frames); ++t) outs.push_back(td.chunk(zt.narrow(2, t, 1)));
        return cat(outs, 2);
      }();
      const Tensor got = video.narrow(2, 0, ref.size(2)).narrow(3, 0, ref.size(3)).narrow(4, 0, ref.size(4));
      const double db = psnr(got.to(DType::F32), ref);
      std::printf("PSNR of the first tile (%lld frames) against the CPU in f32: %.1f dB\n", (long long)ref.size(2), db);
      j["psnr_db"] = db;
    }
  } else {
    std::printf("peak resident set: %.2f GiB\n", peak_rss_bytes() / (1024.0 * 1024.0 * 1024.0));
    j["peak_rss_bytes"] = peak_rss_bytes();
  }
  if (!all(isfinite(video)).item<bool>()) throw Error("bench vae: the decoded video has non-finite values");
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace kiln::cli
