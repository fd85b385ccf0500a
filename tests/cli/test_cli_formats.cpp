// The weight files of `remat train --save` / `--load` in other tools' layouts, through the built
// executable: nanoGPT's names, Hugging Face's GPT-2 layout, and the --format hf-gpt2 directory
// that Transformers loads (tests/reference checks that with Transformers itself).
#include "cli_harness.h"

TEST_F(Cli, NanoGPTNamesOnSaveAndLoad) {
  const std::string nano = path("nano.safetensors");
  Result r = run(train_args({{"--save", nano}, {"--format", "nanogpt"}}));
  ASSERT_EQ(r.code, 0) << r.output;
  nn::SafetensorsFile f = nn::load_safetensors(nano);
  EXPECT_EQ(f.tensors.count("transformer.h.0.attn.c_attn.weight"), 1u);
  EXPECT_EQ(f.tensors.count("transformer.wte.weight"), 1u);
  EXPECT_EQ(f.tensors.count("wte.weight"), 0u);
  // the same run saved with remat's names samples the same text from either file
  const std::string own = path("own.safetensors");
  ASSERT_EQ(run(train_args({{"--save", own}})).code, 0);
  const std::string s = "sample --threads 1 --tokens 20 --temperature 0 --load ";
  Result a = run(s + nano), b = run(s + own);
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  // and training continues from it
  r = run(train_args({{"--steps", "1"}}) + " --load " + nano);
  EXPECT_EQ(r.code, 0) << r.output;
  expect_usage_error(train_args({{"--format", "hf"}}), {"--format must be remat, nanogpt or hf-gpt2"});
}

// A nanoGPT state_dict as the safetensors package saves it: nanoGPT's names and no remat
// metadata (at most PyTorch's {"format": "pt"}). The architecture is read from the shapes, the
// heads from --heads, the vocabulary from --data.
TEST_F(Cli, NanoGPTFileWithoutMetadata) {
  nn::SafetensorsFile own = nn::load_safetensors(path("w.safetensors"));
  const std::map<std::string, Tensor> nano = nn::gpt_weights_from_remat(own.tensors, nn::GPTWeightNames::nanogpt);
  auto write = [&](const std::string& name, std::map<std::string, Tensor> tensors, const nn::Metadata& metadata) {
    nn::save_safetensors(path(name), nn::NamedTensors(tensors.begin(), tensors.end()), metadata);
    return path(name);
  };
  const std::string bare = write("bare.safetensors", nano, {});
  const std::string pt = write("pt.safetensors", nano, {{"format", "pt"}});
  const std::string data = " --data " + path("corpus.txt");
  // the same text as from remat's own file of the same weights (heads 2, as trained)
  const std::string s0 = "sample --threads 1 --tokens 20 --temperature 0", s = s0 + " --heads 2";
  Result expected = run(s + " --load " + path("w.safetensors"));
  ASSERT_EQ(expected.code, 0) << expected.output;
  for (const std::string& file : {bare, pt}) {
    Result r = run(s + data + " --load " + file);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output, expected.output);
  }
  // the same validation loss
  const std::string eval = "train --threads 1 --batch 2 --eval-only --json" + data;
  Streams a = run_streams(eval + " --load " + path("w.safetensors"));
  Streams b = run_streams(eval + " --heads 2 --load " + bare);
  EXPECT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.out.find("\"val_loss\":"), std::string::npos) << b.out;
  EXPECT_EQ(a.out, b.out);
  // and training continues from it
  EXPECT_EQ(run("train --quiet --threads 1 --batch 2 --steps 1 --heads 2" + data + " --load " + bare).code, 0);

  // what is missing is named: the heads (width 8 and --heads 3), the vocabulary (another text)
  expect_usage_error(s0 + data + " --heads 3 --load " + bare, {bare, "no remat metadata", "--heads 3"});
  expect_usage_error("train --quiet --eval-only --heads 3" + data + " --load " + bare, {"--heads 3"});
  {
    std::ofstream other(path("other.txt"));
    for (int i = 0; i < 100; ++i) other << "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n";
  }
  expect_error(s + " --data " + path("other.txt") + " --load " + bare,
               {bare, "has no vocabulary in its metadata", "--data " + path("other.txt"), "distinct bytes"});
  expect_error("train --quiet --eval-only --heads 2 --data " + path("other.txt") + " --load " + bare,
               {bare, "has no vocabulary in its metadata"});
  // hostile tensors: named, with the expected shape, by both commands
  std::map<std::string, Tensor> odd = nano;
  odd["transformer.h.0.mlp.c_fc.weight"] = zeros({16, 8});
  const std::string wrong = write("wrong.safetensors", odd, {});
  odd = nano;
  odd.erase("transformer.h.0.attn.c_proj.bias");
  odd["transformer.h.0.attn.rotary"] = zeros({4});
  const std::string missing = write("missing.safetensors", odd, {});
  for (const std::string command : {s + data, "train --quiet --steps 1 --heads 2" + data}) {
    expect_error(command + " --load " + wrong, {wrong, "\"transformer.h.0.mlp.c_fc.weight\" is [16, 8], expected [32, 8]"});
    expect_error(command + " --load " + missing, {missing, "missing \"transformer.h.0.attn.c_proj.bias\" (expected [8])",
                                                  "unknown tensor \"transformer.h.0.attn.rotary\" ([4])"});
  }
  // with remat's metadata, --heads must agree with it
  expect_usage_error(s0 + " --heads 4 --load " + path("w.safetensors"), {"sample: --heads 4 disagrees", "(heads 2)"});
  // the architecture flags of train are compared with what the shapes say
  expect_usage_error("train --quiet --steps 1 --heads 2 --layers 3" + data + " --load " + bare,
                     {"--layers 3 disagrees", "(layers 1)"});
}

// --format hf-gpt2: Hugging Face's GPT2LMHeadModel layout (Conv1D weights [in, out]); --load
// tells it from nanoGPT's by the shapes; a file mixing both is an error naming the tensor.
TEST_F(Cli, HuggingFaceLayoutOnSaveAndLoad) {
  const std::string hf = path("hf"), nano = path("nano2.safetensors"), own = path("own2.safetensors");
  for (const auto& [file, format] : {std::pair{hf, "hf-gpt2"}, {nano, "nanogpt"}, {own, "remat"}})
    ASSERT_EQ(run(train_args({{"--save", file}, {"--format", format}})).code, 0) << format;
  nn::SafetensorsFile f = nn::load_safetensors(hf + "/model.safetensors");
  EXPECT_EQ(f.tensors.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{8, 24}));  // [C, 3C]
  EXPECT_EQ(f.tensors.at("transformer.h.0.mlp.c_fc.weight").shape(), (Shape{8, 32}));
  EXPECT_EQ(f.tensors.at("transformer.h.0.mlp.c_proj.weight").shape(), (Shape{32, 8}));
  EXPECT_EQ(f.tensors.count("transformer.h.0.attn.c_attn.bias"), 1u);
  // the same text and validation loss from the three files of one run
  const std::string s = "sample --threads 1 --tokens 20 --temperature 0 --load ";
  const std::string eval = "train --threads 1 --batch 2 --eval-only --json --data " + path("corpus.txt") + " --load ";
  Result a = run(s + own);
  Streams va = run_streams(eval + own);
  ASSERT_EQ(a.code, 0) << a.output;
  for (const std::string& file : {hf, nano}) {
    EXPECT_EQ(run(s + file).output, a.output) << file;
    EXPECT_EQ(run_streams(eval + file).out, va.out) << file;
  }
  // training continues from it
  EXPECT_EQ(run(train_args({{"--steps", "1"}}) + " --load " + hf).code, 0);

  // without remat's metadata a Hugging Face file is read with their GELU (the tanh form): the
  // same loss as the file with metadata saying so
  auto write = [&](const std::string& name, std::map<std::string, Tensor> tensors, const nn::Metadata& metadata) {
    nn::save_safetensors(path(name), nn::NamedTensors(tensors.begin(), tensors.end()), metadata);
    return path(name);
  };
  // (the MLP's input scaled up, where the two GELUs differ more than f32 rounding)
  std::map<std::string, Tensor> big = f.tensors;
  big["transformer.h.0.mlp.c_fc.weight"] = mul_scalar(big.at("transformer.h.0.mlp.c_fc.weight"), 10.0);
  nn::Metadata tanh = f.metadata;
  tanh["gelu"] = "tanh";
  const std::string bare = write("hf-bare.safetensors", big, {{"format", "pt"}});
  const std::string described = write("hf-tanh.safetensors", big, tanh);
  const std::string exact = write("hf-exact.safetensors", big, f.metadata);
  Streams vb = run_streams(eval + bare + " --heads 2"), vt = run_streams(eval + described);
  EXPECT_EQ(vb.code, 0) << vb.err;
  EXPECT_EQ(vb.out, vt.out);
  // the single-file form written before the directory (remat's "format", Hugging Face's names) still loads
  nn::Metadata single = f.metadata;
  single["format"] = "remat-char-gpt";
  EXPECT_EQ(run_streams(eval + write("hf-single.safetensors", f.tensors, single)).out, va.out);
  Streams ve = run_streams(eval + exact);
  EXPECT_EQ(ve.code, 0) << ve.err;
  EXPECT_NE(vb.out, ve.out);  // exact and tanh GELU differ
  nn::Metadata odd = f.metadata;
  odd["gelu"] = "fast";
  expect_error(eval + write("hf-gelu.safetensors", f.tensors, odd), {"metadata \"gelu\"", "\"fast\""});

  // mixed: Hugging Face by c_attn, c_fc as nanoGPT's; with and without metadata
  std::map<std::string, Tensor> mixed = f.tensors;
  mixed["transformer.h.0.mlp.c_fc.weight"] = mixed.at("transformer.h.0.mlp.c_fc.weight").transpose(0, 1).contiguous();
  for (const std::string& file : {write("mixed.safetensors", mixed, f.metadata), write("mixed-bare.safetensors", mixed, {})}) {
    expect_error(s + file + " --heads 2 --data " + path("corpus.txt"),
                 {file, "\"transformer.h.0.mlp.c_fc.weight\" is [32, 8], expected [8, 32]"});
    expect_error(eval + file + " --heads 2", {file, "\"transformer.h.0.mlp.c_fc.weight\" is [32, 8], expected [8, 32]"});
  }
}

// --format hf-gpt2 writes a directory that Transformers' GPT2LMHeadModel.from_pretrained loads
// (tests/reference/check_hf_gpt2.py runs Transformers on it): model.safetensors with "format" "pt"
// and config.json describing the model; remat loads the directory back, and refuses a --save
// that is a file and a directory without model.safetensors.
TEST_F(Cli, HuggingFaceDirectory) {
  const std::string dir = path("hf-dir");
  Result saved = run(train_args({{"--save", dir}, {"--format", "hf-gpt2"}, {"--tie-embeddings", ""}}));
  ASSERT_EQ(saved.code, 0) << saved.output;
  nn::SafetensorsFile f = nn::load_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.count("transformer.wte.weight"), 1u);
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);  // tied
  std::ifstream in(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  const int64_t vocab = f.tensors.at("transformer.wte.weight").size(0);
  EXPECT_EQ(config.at("model_type"), "gpt2");
  EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config.at("vocab_size"), vocab);
  EXPECT_EQ(config.at("n_embd"), f.tensors.at("transformer.wte.weight").size(1));
  EXPECT_EQ(config.at("n_positions"), f.tensors.at("transformer.wpe.weight").size(0));
  EXPECT_EQ(config.at("n_layer"), std::stoll(f.metadata.at("layers")));
  EXPECT_EQ(config.at("n_head"), std::stoll(f.metadata.at("heads")));
  EXPECT_EQ(config.at("n_inner"), 4 * config.at("n_embd").get<int64_t>());
  EXPECT_EQ(config.at("activation_function"), "gelu");  // remat's exact GELU; "gelu_new" is the tanh form
  EXPECT_EQ(config.at("layer_norm_epsilon"), 1e-5);
  EXPECT_EQ(config.at("tie_word_embeddings"), true);
  EXPECT_EQ(config.at("dtype"), "float32");  // the saved weights' precision, from_pretrained's default
  EXPECT_EQ(config.at("torch_dtype"), "float32");
  for (const char* id : {"bos_token_id", "eos_token_id"}) {
    EXPECT_GE(config.at(id).get<int64_t>(), 0) << id;
    EXPECT_LT(config.at(id).get<int64_t>(), vocab) << id;
  }
  // the vocabulary as a tokenizer AutoTokenizer loads (checked against Transformers by
  // tests/reference/check_hf_tokenizer.py): the byte-level alphabet, one character a token, a
  // word-level model with remat's ids whose unknown token is not in it (a byte outside is refused);
  // the alphabet maps 'a' to itself, '\n' to U+010A and ' ' to U+0120
  std::ifstream tokenizer_in(dir + "/tokenizer.json");
  const nlohmann::json tokenizer_json = nlohmann::json::parse(tokenizer_in);
  const nlohmann::json& vocab_json = tokenizer_json.at("model").at("vocab");
  EXPECT_EQ(tokenizer_json.at("model").at("type"), "WordLevel");
  EXPECT_FALSE(vocab_json.contains(tokenizer_json.at("model").at("unk_token").get<std::string>()));
  EXPECT_EQ(tokenizer_json.at("decoder").at("type"), "ByteLevel");
  const std::string vocabulary = f.metadata.at("vocabulary");
  std::vector<int> bytes;
  for (size_t at = 0; at < vocabulary.size();) {
    size_t end = vocabulary.find(',', at);
    if (end == std::string::npos) end = vocabulary.size();
    bytes.push_back(std::stoi(vocabulary.substr(at, end - at)));
    at = end + 1;
  }
  ASSERT_EQ(static_cast<int64_t>(vocab_json.size()), vocab);
  auto id_of = [&](int byte) { return static_cast<int64_t>(std::find(bytes.begin(), bytes.end(), byte) - bytes.begin()); };
  EXPECT_EQ(vocab_json.at("a"), id_of('a'));
  EXPECT_EQ(vocab_json.at("\xC4\x8A"), id_of('\n'));
  EXPECT_EQ(vocab_json.at("\xC4\xA0"), id_of(' '));
  std::ifstream tokenizer_config_in(dir + "/tokenizer_config.json");
  const nlohmann::json tokenizer_config = nlohmann::json::parse(tokenizer_config_in);
  EXPECT_EQ(tokenizer_config.at("tokenizer_class"), "PreTrainedTokenizerFast");
  EXPECT_FALSE(std::filesystem::exists(dir + "/vocab.json"));  // GPT-2's BPE files would drop unknown bytes
  // loaded back from the directory: the same text as from the remat file of the same run
  const std::string own = path("hf-dir-own.safetensors");
  ASSERT_EQ(run(train_args({{"--save", own}, {"--tie-embeddings", ""}})).code, 0);
  const std::string s = "sample --threads 1 --tokens 20 --temperature 0 --load ";
  Result from_dir = run(s + dir);
  ASSERT_EQ(from_dir.code, 0) << from_dir.output;
  EXPECT_EQ(from_dir.output, run(s + own).output);
  EXPECT_EQ(run(train_args({{"--steps", "1"}}) + " --load " + dir).code, 0);
  // saved again over itself: still a directory
  EXPECT_EQ(run(train_args({{"--save", dir}, {"--format", "hf-gpt2"}})).code, 0);
  EXPECT_TRUE(fs::is_regular_file(dir + "/config.json"));
  // a directory without remat's metadata (as Transformers' save_pretrained writes one): the heads
  // and the GELU come from its config.json, which must describe what remat computes
  const std::string bare = path("hf-bare-dir"), eval = "train --threads 1 --batch 2 --eval-only --json --data " +
                                                       path("corpus.txt") + " --load ";
  fs::create_directory(bare);
  auto write_bare = [&](const std::map<std::string, Tensor>& tensors, const nlohmann::json& c) {
    nn::save_safetensors(bare + "/model.safetensors", nn::NamedTensors(tensors.begin(), tensors.end()), {{"format", "pt"}});
    std::ofstream(bare + "/config.json") << c.dump();
  };
  write_bare(f.tensors, config);
  Streams from_bare = run_streams(eval + bare);  // no --heads: 2 from the config (the default is not 2)
  ASSERT_EQ(from_bare.code, 0) << from_bare.err;
  EXPECT_EQ(from_bare.out, run_streams(eval + own).out);  // the same weights as a remat file
  // the GELU it names (the MLP's input scaled up, where the two differ more than f32 rounding)
  std::map<std::string, Tensor> big = f.tensors;
  big["transformer.h.0.mlp.c_fc.weight"] = mul_scalar(big.at("transformer.h.0.mlp.c_fc.weight"), 10.0);
  nlohmann::json tanh = config;
  tanh["activation_function"] = "gelu_new";
  write_bare(big, config);
  const std::string exact_out = run_streams(eval + bare).out;
  write_bare(big, tanh);
  Streams tanh_run = run_streams(eval + bare);
  EXPECT_EQ(tanh_run.code, 0) << tanh_run.err;
  EXPECT_NE(tanh_run.out, exact_out);
  // what remat cannot compute, or cannot read, is an error naming it
  for (const auto& [change, fragment] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"layer_norm_epsilon", 1e-6}}, "\"layer_norm_epsilon\" is 1e-06; remat's LayerNorms use 1e-05"},
           {{{"activation_function", "relu"}}, "\"activation_function\" is \"relu\""},
           {{{"activation_function", 3}}, "\"activation_function\" is 3, expected a string"},
           {{{"n_head", 0}}, "\"n_head\" is 0, expected a whole number >= 1"},
           {{{"scale_attn_by_inverse_layer_idx", true}}, "remat's attention scales by 1/sqrt(head size) only"}}) {
    nlohmann::json c = config;
    c.update(change);
    write_bare(f.tensors, c);
    expect_error(eval + bare, {bare + "/config.json", fragment});
  }
  nlohmann::json three = config;
  three["n_head"] = 3;
  write_bare(f.tensors, three);
  expect_usage_error(eval + bare, {bare, "not a multiple of \"n_head\" 3 of its config.json"});
  std::ofstream(bare + "/config.json") << std::string(100, '[') + std::string(100, ']');
  expect_error(eval + bare, {"is not a JSON object (nested too deeply)"});
  std::ofstream(bare + "/config.json") << "{\"n_head\": ";
  expect_error(eval + bare, {bare + "/config.json is not a JSON object"});
  std::ofstream(bare + "/config.json") << R"({"n_head": 2, "n_head": 3})";
  expect_error(eval + bare, {bare + "/config.json has the key \"n_head\" twice in one object"});

  // a --save that is a file; a directory without the weights
  expect_usage_error(train_args({{"--save", own}, {"--format", "hf-gpt2"}}), {own, "is a file", "writes a directory"});
  fs::create_directory(path("empty-dir"));
  expect_error(s + path("empty-dir"), {path("empty-dir"), "is a directory without model.safetensors"});
}

// A mixed-precision run (--dtype bf16) saves its float32 master weights, or with --save-dtype bf16
// those weights rounded once, in every format; either file loads (sample, further training).
TEST_F(Cli, MixedPrecisionRunSavesFloat32OrBf16Weights) {
  for (const std::string format : {"remat", "nanogpt", "hf-gpt2"}) {
    SCOPED_TRACE(format);
    const std::string ext = format == "hf-gpt2" ? "" : ".safetensors";
    const std::string f32 = path("mp-f32-" + format + ext), bf16 = path("mp-bf16-" + format + ext);
    Result r = run(train_args({{"--dtype", "bf16"}, {"--steps", "2"}, {"--save", f32}, {"--format", format}}));
    ASSERT_EQ(r.code, 0) << r.output;
    r = run(train_args({{"--dtype", "bf16"}, {"--steps", "2"}, {"--save", bf16}, {"--format", format}, {"--save-dtype", "bf16"}}));
    ASSERT_EQ(r.code, 0) << r.output;
    auto file = [&](const std::string& p) { return format == "hf-gpt2" ? p + "/model.safetensors" : p; };
    nn::SafetensorsFile a = nn::load_safetensors(file(f32)), b = nn::load_safetensors(file(bf16));
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [name, t] : a.tensors) {
      EXPECT_EQ(t.dtype(), DType::f32) << name;
      const Tensor& h = b.tensors.at(name);
      EXPECT_EQ(h.dtype(), DType::bf16) << name;
      EXPECT_EQ(h.to(DType::f32).to_vector(), t.to(DType::bf16).to(DType::f32).to_vector()) << name;
    }
    if (format == "hf-gpt2")  // config.json names each directory's weights' precision
      for (const auto& [dir, dtype] : {std::pair{f32, "float32"}, std::pair{bf16, "bfloat16"}}) {
        std::ifstream in(dir + "/config.json");
        EXPECT_EQ(nlohmann::json::parse(in).at("dtype"), dtype) << dir;
      }
    const std::string s = "sample --threads 1 --tokens 20 --temperature 0 --load ";
    for (const std::string& w : {f32, bf16}) {
      Result sampled = run(s + w);
      EXPECT_EQ(sampled.code, 0) << sampled.output;
      Result more = run(train_args({{"--steps", "1"}, {"--dtype", "bf16"}}) + " --load " + w);
      EXPECT_EQ(more.code, 0) << more.output;
    }
  }
  expect_usage_error(train_args({{"--dtype", "f8"}}), {"--dtype must be f32, bf16 or f16", "'f8'"});
  expect_usage_error(train_args({{"--save-dtype", "f16"}}), {"--save-dtype must be f32 or bf16", "'f16'"});
}
