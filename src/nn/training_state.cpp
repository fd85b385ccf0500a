// Training states: write a directory atomically, read it back only once every byte is checked
// (remat/nn/training_state.h).
//
// Note [training state checks]. Three checksums chain every byte of a state to state.json: the
// manifest's own (XXH64 of its content without the "checksum" key, serialised compactly with keys
// sorted), the header of each safetensors file (XXH64 of its first 8 + N bytes, recorded in the
// manifest with the file's size), and each tensor's data (XXH64 of its bytes, in the file's own
// metadata, which the header checksum covers). So a flipped byte in a tensor names the tensor, one
// in a header names the file, and one in state.json is found before anything in it is believed.
// Loading reads every file into host memory and checks the checksums, the configuration, the
// model and the optimizer before it writes anything; only then are the values copied in.
#include "remat/nn/training_state.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "remat/autodiff.h"
#include "remat/nn/safetensors.h"
#include "io/strict_json.h"
#include "io/xxh64.h"
#include "training_state_names.h"

namespace remat::nn {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace state_names;

constexpr const char* kFormat = "remat-training-state";
constexpr int kVersion = 1;
constexpr const char* kPending = "state.pending.json";  // the manifest before commit adds the files
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kChecksumKey = "xxh64:";  // + a tensor's name, in a file's metadata
constexpr const char* kCounterKey = "counter:";  // + NAME/COUNTER, in an optimizer file's metadata
constexpr const char* kOptionKey = "option:";
constexpr uintmax_t kMaxManifestBytes = uintmax_t{1} << 28;

std::string saving(const std::string& path) { return detail::concat("save_training_state(\"", path, "\")"); }
std::string loading(const std::string& path) { return detail::concat("load_training_state(\"", path, "\")"); }

std::string optimizer_file(StateShard shard) {
  if (shard.count == 1) return "optimizer.safetensors";
  return detail::concat("optimizer-shard-", shard.index, "-of-", shard.count, ".safetensors");
}

std::string exact_text(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// ---- what a state holds of the model and the optimizer

// The parameters, then the buffers, under their dotted names.
NamedTensors model_tensors(const Module& model) {
  NamedTensors all = model.named_parameters();
  for (auto& named : model.named_buffers()) all.push_back(std::move(named));
  return all;
}

// Every module's counters, as "module.path.counter".
std::map<std::string, int64_t> model_counters(const Module& model) {
  std::map<std::string, int64_t> all;
  for (const auto& [path, m] : model.named_modules())
    for (const auto& [name, value] : m->state_counters()) all[path.empty() ? name : path + "." + name] = value;
  return all;
}

// The model's name of each of the optimizer's parameters.
std::vector<std::string> optimizer_names(const Module& model, const Optimizer& optimizer, const std::string& who) {
  std::map<const TensorImpl*, std::string> by_impl;
  for (const auto& [name, p] : model.named_parameters()) by_impl.emplace(p.impl_ptr().get(), name);
  std::vector<std::string> names;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    auto it = by_impl.find(optimizer.params()[i].impl_ptr().get());
    REMAT_CHECK(it != by_impl.end(), who, ": parameter ", i, " of the ", optimizer.name(), " optimizer (\"",
                optimizer.params()[i].name(), "\") is not a parameter of the model");
    names.push_back(it->second);
  }
  return names;
}

// A CPU, contiguous copy of t's values (t itself when it already is one).
Tensor host_values(const Tensor& t) {
  Tensor d = t.detach();
  if (d.device().type == DeviceType::cpu && d.is_contiguous()) return d;
  Tensor host = Tensor::empty(d.shape(), d.dtype());
  host.copy_(d);
  return host;
}

uint64_t checksum(const Tensor& host) { return io::xxh64(host.raw_data(), host.nbytes()); }

// Writes `tensors` to `file` with each one's checksum in the metadata.
void write_checked(const std::string& file, const NamedTensors& tensors, Metadata metadata) {
  NamedTensors host;
  host.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    Tensor values = host_values(t);
    metadata[kChecksumKey + name] = io::xxh64_hex(checksum(values));
    host.emplace_back(name, std::move(values));
  }
  save_safetensors(file, host, metadata);
}

// The optimizer's file: per parameter its tensors ("NAME/KEY") and counters (metadata
// "counter:NAME/KEY"), its kind, options, learning rate and parameter names.
void write_optimizer(const std::string& file, const Optimizer& optimizer, const std::vector<std::string>& names,
                     StateShard shard) {
  Metadata meta = {{"optimizer", optimizer.name()},
                   {"lr", exact_text(optimizer.lr())},
                   {"shard", std::to_string(shard.index)},
                   {"shards", std::to_string(shard.count)},
                   {"parameters", json(names).dump()}};
  for (const auto& [key, value] : optimizer.options_text()) meta[kOptionKey + key] = value;
  NamedTensors tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    Optimizer::ParameterState state = optimizer.parameter_state(i);
    for (auto& [key, t] : state.tensors) tensors.emplace_back(names[i] + "/" + key, std::move(t));
    for (const auto& [key, value] : state.counters) meta[kCounterKey + names[i] + "/" + key] = std::to_string(value);
  }
  write_checked(file, tensors, meta);
}

json manifest_body(const Module& model, const TrainingState& state, StateShard shard, const Optimizer& optimizer) {
  json counters = json::object();
  for (const auto& [name, value] : model_counters(model)) counters[name] = value;
  return json{{"format", kFormat},
              {"version", kVersion},
              {"step", state.step},
              {"rng", {{"seed", state.rng.seed}, {"offset", state.rng.offset}}},
              {"configuration", state.configuration},
              {"extra", state.extra},
              {"counters", std::move(counters)},
              {"optimizer", {{"kind", optimizer.name()}, {"shards", shard.count}}}};
}

std::string manifest_checksum(json manifest) {
  manifest.erase("checksum");
  const std::string text = manifest.dump();
  return io::xxh64_hex(io::xxh64(text.data(), text.size()));
}

// The XXH64 of a safetensors file's header (its 8-byte length and the JSON), and its size.
struct FileSeal {
  uintmax_t bytes = 0;
  std::string header;
};
FileSeal seal_of(const std::string& file, const std::string& who) {
  std::error_code ec;
  FileSeal seal;
  seal.bytes = fs::file_size(file, ec);
  REMAT_CHECK(!ec, who, ": cannot read ", file, ": ", ec.message());
  std::ifstream in(file, std::ios::binary);
  unsigned char length[8] = {};
  in.read(reinterpret_cast<char*>(length), 8);
  REMAT_CHECK(in && seal.bytes >= 8, who, ": cannot read the header of ", file, " (", seal.bytes, " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  REMAT_CHECK(n <= seal.bytes - 8 && n <= kMaxManifestBytes, who, ": ", file, " has a header length of ", n,
              " bytes, more than the file (", seal.bytes, " bytes) holds: it is truncated or corrupted");
  std::string header(8 + n, '\0');
  std::memcpy(header.data(), length, 8);
  in.read(header.data() + 8, static_cast<std::streamsize>(n));
  REMAT_CHECK(in, who, ": cannot read the header of ", file);
  seal.header = io::xxh64_hex(io::xxh64(header.data(), header.size()));
  return seal;
}

std::string read_text(const std::string& file, const std::string& who) {
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(file, ec);
  REMAT_CHECK(!ec, who, ": cannot read ", file, ": ", ec.message());
  REMAT_CHECK(bytes <= kMaxManifestBytes, who, ": ", file, " has ", bytes, " bytes, more than a state's ",
              kMaxManifestBytes);
  std::ifstream in(file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REMAT_CHECK(text.size() == bytes, who, ": cannot read ", file);
  return text;
}

json parse_json(const std::string& text, const std::string& file, const std::string& who) {
  const io::strict_json::Problem p = io::strict_json::check(text, {.max_depth = 4});
  REMAT_CHECK(p.kind == io::strict_json::Problem::none, who, ": ", file, " is not a state's JSON (",
              p.kind == io::strict_json::Problem::repeated_key ? "the key \"" + p.detail + "\" twice" : p.detail,
              "): the file is corrupted");
  return json::parse(text);
}

}  // namespace

// ---- writing

void begin_training_state(const std::string& path) {
  const std::string who = saving(path), partial = path + kPartial;
  std::error_code ec;
  REMAT_CHECK(!fs::exists(path, ec), who, ": ", path, " already exists (a state is never overwritten)");
  fs::remove_all(partial, ec);  // left by a write that was interrupted
  REMAT_CHECK(!ec, who, ": cannot remove ", partial, " (left by an interrupted write): ", ec.message());
  REMAT_CHECK(fs::create_directory(partial, ec) && !ec, who, ": cannot create the directory ", partial, ": ",
              ec ? ec.message() : "it exists");
}

void write_training_state_shard(const std::string& path, const Module& model, const Optimizer& optimizer,
                                const TrainingState& state, StateShard shard, const Metadata& model_metadata) {
  const std::string who = saving(path);
  REMAT_CHECK(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, who, ": shard ", shard.index, " of ",
              shard.count, " does not exist");
  REMAT_CHECK(state.step >= 0, who, ": the step must be >= 0, got ", state.step);
  const fs::path dir = path + kPartial;
  std::error_code ec;
  REMAT_CHECK(fs::is_directory(dir, ec), who, ": ", dir.string(), " does not exist (begin_training_state makes it)");
  const std::vector<std::string> names = optimizer_names(model, optimizer, who);
  write_optimizer((dir / optimizer_file(shard)).string(), optimizer, names, shard);
  if (shard.index != 0) return;
  for (const auto& [key, value] : model_metadata)
    REMAT_CHECK(key.rfind(kChecksumKey, 0) != 0, who, ": model metadata key \"", key, "\" is reserved");
  write_checked((dir / kModelFile).string(), model_tensors(model), model_metadata);
  io::write_file_atomically((dir / kPending).string(), manifest_body(model, state, shard, optimizer).dump(1) + "\n",
                                who);
}

void commit_training_state(const std::string& path, int shards) {
  const std::string who = saving(path);
  const fs::path dir = path + kPartial;
  json manifest = parse_json(read_text((dir / kPending).string(), who), kPending, who);
  REMAT_CHECK(manifest.at("optimizer").at("shards") == shards, who, ": the state was begun for ",
              manifest.at("optimizer").at("shards").dump(), " optimizer shards, not ", shards);
  json files = json::object();
  std::vector<std::string> names = {kModelFile};
  for (int i = 0; i < shards; ++i) names.push_back(optimizer_file({i, shards}));
  for (const std::string& name : names) {
    std::error_code ec;
    REMAT_CHECK(fs::is_regular_file(dir / name, ec), who, ": ", name, " was not written");
    const FileSeal seal = seal_of((dir / name).string(), who);
    files[name] = {{"bytes", seal.bytes}, {"header_xxh64", seal.header}};
  }
  manifest["files"] = std::move(files);
  manifest["checksum"] = manifest_checksum(manifest);
  io::write_file_atomically((dir / kManifest).string(), manifest.dump(1) + "\n", who);
  std::error_code ec;
  fs::remove(dir / kPending, ec);
  io::sync_directory(dir.string(), who);
  fs::rename(dir, path, ec);  // the state exists from here on
  REMAT_CHECK(!ec, who, ": cannot rename ", dir.string(), " to ", path, ": ", ec.message());
  const fs::path parent = fs::path(path).parent_path();
  io::sync_directory(parent.empty() ? "." : parent.string(), who);
}

void abandon_training_state(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path + kPartial, ec);
}

void save_training_state(const std::string& path, const Module& model, const Optimizer& optimizer,
                         const TrainingState& state, const Metadata& model_metadata) {
  begin_training_state(path);
  try {
    write_training_state_shard(path, model, optimizer, state, {0, 1}, model_metadata);
    commit_training_state(path, 1);
  } catch (...) {
    abandon_training_state(path);
    throw;
  }
}

// ---- reading

namespace {

json checked_manifest(const std::string& path, const std::string& who);

// state.json, its checksum and its fields checked.
json read_manifest(const std::string& path, const std::string& who) {
  try {
    return checked_manifest(path, who);
  } catch (const json::exception& e) {
    throw Error(detail::concat(who, ": ", kManifest, " is malformed: ", e.what()));
  }
}

json checked_manifest(const std::string& path, const std::string& who) {
  const fs::path file = fs::path(path) / kManifest;
  std::error_code ec;
  REMAT_CHECK(fs::is_directory(path, ec), who, ": ", path, " is not a directory");
  REMAT_CHECK(fs::is_regular_file(file, ec), who, ": ", path, " has no ", kManifest,
              " (not a training state, or one whose write did not finish)");
  json j = parse_json(read_text(file.string(), who), kManifest, who);
  REMAT_CHECK(j.is_object() && j.contains("checksum") && j["checksum"].is_string(), who, ": ", kManifest,
              " has no checksum: the file is corrupted");
  REMAT_CHECK(j["checksum"] == manifest_checksum(j), who, ": ", kManifest,
              " does not match its checksum: the file is corrupted (nothing was loaded)");
  auto object_of = [&](const char* key, bool (json::*is)() const) {
    REMAT_CHECK(j.contains(key) && (j[key].*is)(), who, ": ", kManifest, ": \"", key, "\" is missing or of the wrong type");
  };
  object_of("format", &json::is_string);
  REMAT_CHECK(j["format"] == kFormat && j.value("version", 0) == kVersion, who, ": ", path, " is a ", j["format"].dump(),
              " version ", j.value("version", json()).dump(), ", expected ", kFormat, " version ", kVersion);
  object_of("step", &json::is_number_unsigned);
  object_of("rng", &json::is_object);
  object_of("configuration", &json::is_object);
  object_of("extra", &json::is_object);
  object_of("counters", &json::is_object);
  object_of("optimizer", &json::is_object);
  object_of("files", &json::is_object);
  REMAT_CHECK(j["rng"].value("seed", json()).is_number_unsigned() && j["rng"].value("offset", json()).is_number_unsigned(),
              who, ": ", kManifest, ": \"rng\" is not {seed, offset}");
  for (const char* key : {"configuration", "extra"})
    for (const auto& [k, v] : j[key].items())
      REMAT_CHECK(v.is_string(), who, ": ", kManifest, ": ", key, " \"", k, "\" is not a string");
  for (const auto& [k, v] : j["counters"].items())
    REMAT_CHECK(v.is_number_unsigned(), who, ": ", kManifest, ": counter \"", k, "\" is not a whole number >= 0");
  REMAT_CHECK(j["optimizer"].value("shards", json()).is_number_unsigned() && j["optimizer"]["shards"] >= 1 &&
                  j["optimizer"].value("kind", json()).is_string(),
              who, ": ", kManifest, ": \"optimizer\" is not {kind, shards}");
  return j;
}

TrainingState state_from(const json& j) {
  TrainingState s;
  s.step = j["step"].get<int64_t>();
  s.rng = RngState{j["rng"]["seed"].get<uint64_t>(), j["rng"]["offset"].get<uint64_t>()};
  s.configuration = j["configuration"].get<Metadata>();
  s.extra = j["extra"].get<Metadata>();
  return s;
}

// A file of the state, its size and header checked against the manifest, its tensors against
// their checksums.
SafetensorsFile read_checked(const std::string& path, const json& manifest, const std::string& name,
                             const std::string& who) {
  const json& files = manifest["files"];
  REMAT_CHECK(files.contains(name) && files[name].is_object(), who, ": ", kManifest, " lists no ", name);
  const std::string file = (fs::path(path) / name).string();
  std::error_code ec;
  REMAT_CHECK(fs::is_regular_file(file, ec), who, ": ", name, " is missing from the state");
  const FileSeal seal = seal_of(file, who);
  REMAT_CHECK(files[name].value("bytes", json()) == seal.bytes, who, ": ", name, " has ", seal.bytes, " bytes, ",
              kManifest, " says ", files[name].value("bytes", json()).dump(), ": the file is truncated or changed");
  REMAT_CHECK(files[name].value("header_xxh64", json()) == seal.header, who, ": the header of ", name,
              " (its tensors' names, shapes and metadata) does not match its checksum: the file is corrupted");
  SafetensorsFile f = load_safetensors(file);
  for (const auto& [tensor, t] : f.tensors) {
    auto sum = f.metadata.find(kChecksumKey + tensor);
    REMAT_CHECK(sum != f.metadata.end(), who, ": tensor \"", tensor, "\" of ", name, " has no checksum");
    REMAT_CHECK(sum->second == io::xxh64_hex(checksum(t)), who, ": tensor \"", tensor, "\" of ", name,
                " does not match its checksum: the file is corrupted (nothing was loaded)");
  }
  return f;
}

// "the state has X, the model has Y" for every difference between the model and the state.
void check_model(const Module& model, const SafetensorsFile& file, const json& manifest, const std::string& who) {
  std::vector<std::string> problems;
  auto describe = [](const Tensor& t) { return detail::concat(dtype_name(t.dtype()), " ", shape_str(t.shape())); };
  std::set<std::string> expected;
  for (const auto& [name, t] : model_tensors(model)) {
    expected.insert(name);
    auto it = file.tensors.find(name);
    if (it == file.tensors.end())
      problems.push_back(detail::concat("the state has no \"", name, "\" (the model's is ", describe(t), ")"));
    else if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype())
      problems.push_back(detail::concat("\"", name, "\" is ", describe(it->second), " in the state, ", describe(t),
                                        " in the model"));
  }
  for (const auto& [name, t] : file.tensors)
    if (expected.count(name) == 0) problems.push_back(detail::concat("the state has \"", name, "\", the model has not"));
  const std::map<std::string, int64_t> counters = model_counters(model);
  for (const auto& [name, value] : counters)
    if (!manifest["counters"].contains(name)) problems.push_back(detail::concat("the state has no counter \"", name, "\""));
  for (const auto& [name, value] : manifest["counters"].items())
    if (counters.count(name) == 0) problems.push_back(detail::concat("the state has a counter \"", name, "\", the model has not"));
  if (problems.empty()) return;
  std::ostringstream out;
  out << who << ": the model differs from the state's (nothing was loaded):";
  for (const auto& p : problems) out << "\n  " << p;
  throw Error(out.str());
}

void check_configuration(const Metadata& expected, const Metadata& state, const std::string& who) {
  std::vector<std::string> problems;
  for (const auto& [key, value] : expected) {
    auto it = state.find(key);
    if (it == state.end()) problems.push_back(detail::concat(key, ": not in the state, \"", value, "\" here"));
    else if (it->second != value)
      problems.push_back(detail::concat(key, ": \"", it->second, "\" in the state, \"", value, "\" here"));
  }
  if (problems.empty()) return;
  std::ostringstream out;
  out << who << ": the configuration differs from the state's (nothing was loaded):";
  for (const auto& p : problems) out << "\n  " << p;
  throw Error(out.str());
}

// One optimizer file of a state, checked against `optimizer` (kind, options) and against its name
// (shard i of n); its learning rate and the parameters it holds the state of.
struct OptimizerFile {
  std::string name;
  SafetensorsFile file;
  double lr = 0;
  std::vector<std::string> parameters;
};
OptimizerFile read_optimizer_file(const std::string& path, const json& manifest, StateShard written,
                                  const Optimizer& optimizer, const std::string& who) {
  OptimizerFile f;
  f.name = optimizer_file(written);
  f.file = read_checked(path, manifest, f.name, who);
  const Metadata& meta = f.file.metadata;
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    REMAT_CHECK(it != meta.end(), who, ": ", f.name, " has no \"", key, "\" in its metadata");
    return it->second;
  };
  REMAT_CHECK(get("optimizer") == optimizer.name(), who, ": the state's optimizer is ", get("optimizer"), ", this run's ",
              optimizer.name());
  REMAT_CHECK(get("shard") == std::to_string(written.index) && get("shards") == std::to_string(written.count), who, ": ",
              f.name, " says it is shard ", get("shard"), " of ", get("shards"));
  for (const auto& [key, value] : optimizer.options_text())
    REMAT_CHECK(get(kOptionKey + key) == value, who, ": the state's ", optimizer.name(), " has ", key, " ",
                get(kOptionKey + key), ", this run's ", value);
  char* end = nullptr;
  f.lr = std::strtod(get("lr").c_str(), &end);
  REMAT_CHECK(*end == '\0' && f.lr >= 0 && std::isfinite(f.lr), who, ": ", f.name, ": \"lr\" is \"", get("lr"), "\"");
  REMAT_CHECK(json::accept(get("parameters")), who, ": ", f.name, ": \"parameters\" is not JSON");
  const json names = json::parse(get("parameters"));
  REMAT_CHECK(names.is_array(), who, ": ", f.name, ": \"parameters\" is not a list");
  for (const auto& n : names) {
    REMAT_CHECK(n.is_string(), who, ": ", f.name, ": \"parameters\" holds a non-name");
    f.parameters.push_back(n.get<std::string>());
  }
  return f;
}

// The state of parameter `name` in `f` (its tensors "NAME/KEY", its counters "counter:NAME/KEY"),
// checked against what `optimizer` holds for its parameter i.
Optimizer::ParameterState parameter_state_in(const OptimizerFile& f, const Optimizer& optimizer, size_t i,
                                              const std::string& name, size_t& tensors, const std::string& who) {
  Optimizer::ParameterState state;
  for (const auto& [key, value] : optimizer.parameter_state(i).counters) {
    auto it = f.file.metadata.find(kCounterKey + name + "/" + key);
    REMAT_CHECK(it != f.file.metadata.end(), who, ": ", f.name, " has no counter ", name, "/", key);
    const std::string& text = it->second;
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &stop, 10);
    REMAT_CHECK(errno == 0 && *stop == '\0' && !text.empty(), who, ": ", f.name, ": counter ", name, "/", key, " is \"",
                text, "\"");
    state.counters.emplace_back(key, v);
  }
  const std::string prefix = name + "/";
  for (auto it = f.file.tensors.lower_bound(prefix); it != f.file.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    if (it->first.find('/', prefix.size()) != std::string::npos) continue;  // a deeper name: another parameter's
    state.tensors.emplace_back(it->first.substr(prefix.size()), it->second);
    ++tensors;
  }
  optimizer.check_parameter_state(i, state);
  return state;
}

// The optimizer's state per parameter, from the state's optimizer files, whatever their number:
// each parameter's from the file that lists it (a state written by N shards loads into an
// optimizer holding any subset of the parameters: re-sharded when read).
std::vector<Optimizer::ParameterState> optimizer_states(const std::string& path, const json& manifest,
                                                        const Optimizer& optimizer, const std::vector<std::string>& names,
                                                        double& lr, const std::string& who) {
  const int written = manifest["optimizer"]["shards"].get<int>();
  std::map<std::string, size_t> wanted;
  for (size_t i = 0; i < names.size(); ++i) wanted.emplace(names[i], i);
  std::vector<Optimizer::ParameterState> states(names.size());
  std::vector<char> found(names.size(), 0);
  std::set<std::string> listed;
  for (int shard = 0; shard < written; ++shard) {
    const OptimizerFile f = read_optimizer_file(path, manifest, {shard, written}, optimizer, who);
    REMAT_CHECK(shard == 0 || f.lr == lr, who, ": the optimizer files disagree on the learning rate");
    lr = f.lr;
    size_t tensors = 0, mine = 0;
    for (const std::string& name : f.parameters) {
      REMAT_CHECK(listed.insert(name).second, who, ": the state of \"", name, "\" is in two optimizer files");
      auto it = wanted.find(name);
      if (it == wanted.end()) {  // another process's: its tensors are counted, not kept
        for (const auto& [tensor, t] : f.file.tensors)
          if (tensor.rfind(name + "/", 0) == 0 && tensor.find('/', name.size() + 1) == std::string::npos) ++tensors;
        continue;
      }
      states[it->second] = parameter_state_in(f, optimizer, it->second, name, tensors, who);
      found[it->second] = 1;
      ++mine;
    }
    REMAT_CHECK(tensors == f.file.tensors.size(), who, ": ", f.name, " holds ", f.file.tensors.size() - tensors,
                " tensors of no parameter it lists");
  }
  for (size_t i = 0; i < names.size(); ++i)
    REMAT_CHECK(found[i], who, ": the state holds no optimizer state for \"", names[i], "\" (its optimizer files list ",
                json(std::vector<std::string>(listed.begin(), listed.end())).dump(), ")");
  return states;
}

}  // namespace

TrainingState read_training_state(const std::string& path) { return state_from(read_manifest(path, loading(path))); }

TrainingState load_training_state(const std::string& path, Module& model, Optimizer& optimizer,
                                  const Metadata& configuration, StateShard shard) {
  const std::string who = loading(path);
  const json manifest = read_manifest(path, who);
  TrainingState state = state_from(manifest);
  check_configuration(configuration, state.configuration, who);
  REMAT_CHECK(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, who, ": shard ", shard.index, " of ",
              shard.count, " does not exist");
  const SafetensorsFile weights = read_checked(path, manifest, kModelFile, who);
  check_model(model, weights, manifest, who);
  double lr = 0;
  const std::vector<Optimizer::ParameterState> states =
      optimizer_states(path, manifest, optimizer, optimizer_names(model, optimizer, who), lr, who);

  // Everything checked: copy it in.
  {
    NoGradGuard no_grad;
    for (auto& [tensor_name, t] : model_tensors(model)) t.copy_(weights.tensors.at(tensor_name));
  }
  for (const auto& [module_path, m] : model.named_modules())
    for (const auto& [counter, value] : m->state_counters())
      const_cast<Module*>(m)->set_state_counter(
          counter, manifest["counters"][module_path.empty() ? counter : module_path + "." + counter].get<int64_t>());
  for (size_t i = 0; i < states.size(); ++i) optimizer.set_parameter_state(i, states[i]);
  optimizer.set_lr(lr);
  set_rng_state(state.rng);
  return state;
}

}  // namespace remat::nn
