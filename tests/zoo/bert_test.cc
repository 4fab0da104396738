// BERT against a PyTorch reference with HuggingFace's math, computed in f64 from the same f32
// weights (tests/golden/make_golden_bert.py, run at test time with Debian's /usr/bin/python3):
// logits, losses and every parameter gradient, the checkpoint names, the tied decoder, padding,
// a weights round trip, and bad input.
#include "models/bert.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::models {
namespace {

using testing::all_close;
using testing::golden_tensor;
using testing::throws_error;

constexpr double kModelRtol = 1e-4;  // the closeness rule for whole f32 models (tests/testing.h)
constexpr int64_t kVocab = 1000;
const char* const kPython = "/usr/bin/python3";
const char* const kScript = "tests/golden/make_golden_bert.py";

bool torch_available() {
  static const bool available =
      std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return available;
}

#define SKIP_WITHOUT_TORCH()                                                    \
  if (!torch_available())                                                       \
  GTEST_SKIP() << kPython                                                       \
               << " cannot import torch (install Debian's python3-torch); the " \
                  "BERT reference values are generated with it"

std::string temp_path(const std::string& file) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + file;
}

// Runs the reference script with `arguments`; an error with its exit status on failure.
void run_script(const std::string& arguments) {
  std::string command = std::string(kPython) + " " + kScript + " " + arguments;
  int status = std::system(command.c_str());
  TESSEL_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "reference script failed (status ", status, "): ", command);
}

struct Golden {
  std::map<std::string, Tensor> tensors;
  SafetensorsMetadata metadata;
  Tensor operator[](const std::string& key) const { return golden_tensor(tensors, key); }
};

// The reference for one preset and mode (batch 3, seq 24, vocab 1000), generated once per run.
const Golden& golden(const std::string& config, const std::string& mode) {
  static std::map<std::string, Golden> cache;
  const std::string key = config + "_" + mode;
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const std::string path = temp_path("bert_" + key + ".safetensors");
  run_script("--config " + config + " --mode " + mode + " --vocab " + std::to_string(kVocab) +
             " --batch 3 --seq 24 --out " + path);
  Golden result;
  result.tensors = load_safetensors(path, &result.metadata);
  return cache.emplace(key, std::move(result)).first->second;
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    names.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

// train: dropout 0 in training mode; eval: the default dropout 0.1, which eval mode ignores.
std::shared_ptr<BertForPreTraining> make_model(const std::string& config, const std::string& mode) {
  BertConfig options = BertConfig::by_name(config).vocab_size(kVocab);
  if (mode == "train") options.dropout(0.0);
  auto model = std::make_shared<BertForPreTraining>(options);
  model->train(mode == "train");
  return model;
}

void load_reference_weights(nn::Module& model, const Golden& reference) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, tensor] : model.named_parameters())
    state[name] = reference["param." + name];
  model.load_state_dict(state);
}

// Forward, loss and backward against the reference: logits, losses, every gradient. With
// MlmOutput::kHeadInput there are no logits; the loss scores the head's input in chunks.
void check_against_reference(const std::string& config, const std::string& mode,
                             MlmOutput mlm_output = MlmOutput::kLogits) {
  const Golden& reference = golden(config, mode);
  auto model = make_model(config, mode);
  load_reference_weights(*model, reference);

  BertPreTrainingOutput output = model->forward(reference["input_ids"], reference["token_type_ids"],
                                                reference["attention_mask"], mlm_output);
  if (mlm_output == MlmOutput::kLogits) {
    EXPECT_TRUE(all_close(output.mlm_logits, reference["mlm_logits"], kModelRtol)) << "logits";
  } else {
    EXPECT_FALSE(output.mlm_logits.defined());
    EXPECT_TRUE(output.decoder_weight.is_same(model->decoder_weight()));
  }
  EXPECT_TRUE(all_close(output.nsp_logits, reference["nsp_logits"], kModelRtol)) << "nsp_logits";

  BertPreTrainingLoss loss =
      bert_pretraining_loss(output, reference["mlm_labels"], reference["nsp_labels"]);
  EXPECT_TRUE(all_close(loss.mlm, reference["mlm_loss"], kModelRtol)) << "mlm loss";
  EXPECT_TRUE(all_close(loss.nsp, reference["nsp_loss"], kModelRtol)) << "nsp loss";
  EXPECT_TRUE(all_close(loss.total, reference["loss"], kModelRtol)) << "loss";

  loss.total.backward();
  int checked = 0;
  for (const auto& [name, parameter] : model->named_parameters()) {
    ASSERT_TRUE(parameter.grad().defined()) << name << " got no gradient";
    EXPECT_TRUE(all_close(parameter.grad(), reference["grad." + name], kModelRtol))
        << "gradient of " << name;
    ++checked;
  }
  EXPECT_EQ(checked,
            static_cast<int>(split_names(reference.metadata.at("parameter_names")).size()));
}

TEST(BertConfig, PresetsHaveThePublishedSizes) {
  struct Expected {
    const char* name;
    int64_t layers, hidden, heads, intermediate;
  };
  for (const Expected& e : {Expected{"tiny", 2, 128, 2, 512}, Expected{"mini", 4, 256, 4, 1024},
                            Expected{"small", 4, 512, 8, 2048}, Expected{"base", 12, 768, 12, 3072},
                            Expected{"large", 24, 1024, 16, 4096}}) {
    BertConfig config = BertConfig::by_name(e.name);
    EXPECT_EQ(config.num_hidden_layers(), e.layers) << e.name;
    EXPECT_EQ(config.hidden_size(), e.hidden) << e.name;
    EXPECT_EQ(config.num_attention_heads(), e.heads) << e.name;
    EXPECT_EQ(config.intermediate_size(), e.intermediate) << e.name;
    EXPECT_EQ(config.vocab_size(), 30522);
    EXPECT_EQ(config.max_position_embeddings(), 512);
    EXPECT_EQ(config.type_vocab_size(), 2);
    EXPECT_DOUBLE_EQ(config.hidden_dropout_prob(), 0.1);
    EXPECT_DOUBLE_EQ(config.attention_probs_dropout_prob(), 0.1);
    EXPECT_DOUBLE_EQ(config.layer_norm_eps(), 1e-12);
    EXPECT_EQ(config.hidden_act(), "gelu");
  }
  BertConfig custom = BertConfig::tiny().vocab_size(1000).dropout(0.0);
  EXPECT_EQ(custom.vocab_size(), 1000);
  EXPECT_EQ(custom.hidden_dropout_prob(), 0.0);
  EXPECT_EQ(custom.attention_probs_dropout_prob(), 0.0);
  EXPECT_EQ(custom.head_size(), 64);
}

TEST(BertConfig, UnknownNameListsTheKnownOnes) {
  EXPECT_TRUE(
      throws_error([] { BertConfig::by_name("medium"); },
                   "unknown configuration 'medium'; known: tiny, mini, small, base, large"));
}

TEST(BertConfig, InconsistentSizesAreRejected) {
  EXPECT_TRUE(throws_error([] { BertModel(BertConfig::tiny().num_attention_heads(3)); },
                           "hidden_size 128 is not a multiple of num_attention_heads 3"));
  EXPECT_TRUE(throws_error([] { BertModel(BertConfig::tiny().hidden_act("swish")); },
                           "hidden_act must be"));
  EXPECT_TRUE(throws_error([] { BertModel(BertConfig::tiny().dropout(1.5)); },
                           "dropout probabilities must be in [0, 1]"));
}

TEST(BertForPreTraining, ParameterNamesAndShapesAreThoseOfTheCheckpoints) {
  SKIP_WITHOUT_TORCH();
  for (const char* config : {"tiny", "mini"}) {
    const Golden& reference = golden(config, "eval");
    std::vector<std::string> expected = split_names(reference.metadata.at("parameter_names"));
    auto model = make_model(config, "eval");
    nn::NamedTensors parameters = model->named_parameters();
    ASSERT_EQ(parameters.size(), expected.size()) << config;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(parameters[i].first, expected[i]) << config << " parameter " << i;
      EXPECT_EQ(parameters[i].second.sizes(), reference["param." + expected[i]].sizes())
          << expected[i];
    }
  }
  // A few names spelled out, as the public checkpoints have them.
  auto model = make_model("tiny", "eval");
  std::set<std::string> names;
  for (const auto& entry : model->named_parameters()) names.insert(entry.first);
  for (const char* name :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.1.attention.self.query.weight",
        "bert.encoder.layer.1.attention.output.LayerNorm.bias",
        "bert.encoder.layer.0.intermediate.dense.weight", "bert.encoder.layer.0.output.dense.bias",
        "bert.pooler.dense.weight", "cls.predictions.bias",
        "cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.weight",
        "cls.seq_relationship.weight"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
}

TEST(BertForPreTraining, TinyInTrainModeWithoutDropoutMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_against_reference("tiny", "train");
}

TEST(BertForPreTraining, TinyInEvalModeMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_against_reference("tiny", "eval");
}

TEST(BertForPreTraining, MiniInTrainModeWithoutDropoutMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_against_reference("mini", "train");
}

TEST(BertForPreTraining, MiniInEvalModeMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_against_reference("mini", "eval");
}

TEST(BertForPreTraining, MlmHeadScoredInChunksMatchesPyTorch) {
  SKIP_WITHOUT_TORCH();
  check_against_reference("tiny", "train", MlmOutput::kHeadInput);
  check_against_reference("mini", "eval", MlmOutput::kHeadInput);
}

TEST(BertModel, SequenceAndPooledOutputsMatchPyTorch) {
  SKIP_WITHOUT_TORCH();
  const Golden& reference = golden("tiny", "eval");
  auto model = make_model("tiny", "eval");
  load_reference_weights(*model, reference);
  NoGradGuard no_grad;
  auto [sequence_output, pooled_output] = model->bert->forward(
      reference["input_ids"], reference["token_type_ids"], reference["attention_mask"]);
  EXPECT_TRUE(all_close(sequence_output, reference["sequence_output"], kModelRtol));
  EXPECT_TRUE(all_close(pooled_output, reference["pooled_output"], kModelRtol));
}

TEST(BertForPreTraining, TiedDecoderIsOneTensorWhoseGradientSumsBothUses) {
  SKIP_WITHOUT_TORCH();
  const Golden& reference = golden("tiny", "eval");
  auto model = make_model("tiny", "eval");
  const Tensor& table = model->bert->embeddings->word_embeddings->weight;
  EXPECT_TRUE(model->decoder_weight().is_same(table));
  int listed = 0;
  for (const auto& [name, parameter] : model->named_parameters()) {
    EXPECT_EQ(name.find("decoder"), std::string::npos) << name;
    if (parameter.is_same(table)) ++listed;
  }
  EXPECT_EQ(listed, 1);

  load_reference_weights(*model, reference);
  BertPreTrainingOutput output = model->forward(reference["input_ids"], reference["token_type_ids"],
                                                reference["attention_mask"]);
  bert_pretraining_loss(output, reference["mlm_labels"], reference["nsp_labels"]).total.backward();
  Tensor from_embedding = reference["tied.grad_from_embedding"];
  Tensor from_decoder = reference["tied.grad_from_decoder"];
  // Both uses contribute: the sum differs from either part alone.
  EXPECT_FALSE(all_close(table.grad(), from_embedding, kModelRtol));
  EXPECT_FALSE(all_close(table.grad(), from_decoder, kModelRtol));
  EXPECT_TRUE(all_close(table.grad(), add(from_embedding, from_decoder), kModelRtol));
}

TEST(BertForPreTraining, WeightsSavedByTesselGiveTheSameLogitsInPyTorch) {
  SKIP_WITHOUT_TORCH();
  const Golden& reference = golden("tiny", "eval");
  auto model = make_model("tiny", "eval");  // Tessel's own initialisation
  const std::string weights = temp_path("bert_tiny_tessel_weights.safetensors");
  const std::string inputs = temp_path("bert_tiny_tessel_inputs.safetensors");
  const std::string logits = temp_path("bert_tiny_tessel_logits.safetensors");
  save_safetensors(weights, model->state_dict());
  save_safetensors(inputs, {{"input_ids", reference["input_ids"]},
                            {"token_type_ids", reference["token_type_ids"]},
                            {"attention_mask", reference["attention_mask"]}});
  run_script("--config tiny --vocab " + std::to_string(kVocab) + " --check-tessel-weights " +
             weights + " --inputs " + inputs + " --out " + logits);
  auto from_python = load_safetensors(logits);

  NoGradGuard no_grad;
  BertPreTrainingOutput output = model->forward(reference["input_ids"], reference["token_type_ids"],
                                                reference["attention_mask"]);
  EXPECT_TRUE(all_close(output.mlm_logits, golden_tensor(from_python, "mlm_logits"), kModelRtol));
  EXPECT_TRUE(all_close(output.nsp_logits, golden_tensor(from_python, "nsp_logits"), kModelRtol));
}

// ---- Behaviour that needs no reference ----

Tensor ids_tensor(const std::vector<int64_t>& values, const Shape& sizes) {
  return from_vector<int64_t>(values, sizes);
}

TEST(BertModel, PaddedPositionsDoNotChangeTheOutputsOfOtherPositions) {
  BertModel model(BertConfig::tiny().vocab_size(50));
  model.eval();
  NoGradGuard no_grad;
  // Row 1 has 5 real tokens and 3 padded positions.
  Tensor ids = ids_tensor({5, 9, 13, 2, 7, 30, 41, 3, 8, 4, 17, 22, 6, 0, 0, 0}, {2, 8});
  Tensor types = ids_tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0}, {2, 8});
  Tensor mask = ids_tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 8});
  auto padded = model.forward(ids, types, mask);

  // Other ids and segments at the padded positions change nothing else.
  Tensor other_ids = ids_tensor({5, 9, 13, 2, 7, 30, 41, 3, 8, 4, 17, 22, 6, 44, 1, 19}, {2, 8});
  Tensor other_types = ids_tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1}, {2, 8});
  auto changed = model.forward(other_ids, other_types, mask);
  EXPECT_TRUE(all_close(narrow(changed.sequence_output, 1, 0, 5),
                        narrow(padded.sequence_output, 1, 0, 5), 1e-6, 0));
  EXPECT_TRUE(all_close(changed.pooled_output, padded.pooled_output, 1e-6, 0));

  // Row 1 alone, without the padding, gives the same outputs for its real tokens.
  auto alone =
      model.forward(narrow(narrow(ids, 0, 1, 1), 1, 0, 5), narrow(narrow(types, 0, 1, 1), 1, 0, 5));
  EXPECT_TRUE(all_close(alone.sequence_output,
                        narrow(narrow(padded.sequence_output, 0, 1, 1), 1, 0, 5), 1e-5));
  EXPECT_TRUE(all_close(alone.pooled_output, narrow(padded.pooled_output, 0, 1, 1), 1e-5));

  // A bool mask and a float mask mean the same as the integer one.
  auto with_bool = model.forward(ids, types, ne(mask, zeros_like(mask)));
  EXPECT_TRUE(all_close(with_bool.sequence_output, padded.sequence_output, 0, 0));
  auto with_float = model.forward(ids, types, to_dtype(mask, DType::kFloat32));
  EXPECT_TRUE(all_close(with_float.sequence_output, padded.sequence_output, 0, 0));
}

TEST(BertModel, MissingTokenTypesMeanSegmentZero) {
  BertModel model(BertConfig::tiny().vocab_size(50));
  model.eval();
  NoGradGuard no_grad;
  Tensor ids = ids_tensor({5, 9, 13, 2, 7, 30}, {2, 3});
  auto implicit = model.forward(ids);
  auto explicit_zeros = model.forward(ids, zeros({2, 3}, DType::kInt64));
  EXPECT_TRUE(all_close(implicit.sequence_output, explicit_zeros.sequence_output, 1e-6, 0));
}

TEST(BertModel, InitialisesLikeBert) {
  BertForPreTraining model(BertConfig::tiny().vocab_size(2000));
  for (const auto& [name, parameter] : model.named_parameters()) {
    std::vector<double> values = parameter.to_vector<double>();
    double sum = 0, squares = 0;
    for (double v : values) sum += v, squares += v * v;
    const double n = static_cast<double>(values.size());
    const double mean = sum / n, stddev = std::sqrt(squares / n - mean * mean);
    if (name.find("LayerNorm.weight") != std::string::npos) {
      EXPECT_EQ(mean, 1.0) << name;
      EXPECT_EQ(stddev, 0.0) << name;
    } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      EXPECT_EQ(squares, 0.0) << name;
    } else if (values.size() >= 10000) {
      EXPECT_NEAR(stddev, 0.02, 0.002) << name;
      EXPECT_NEAR(mean, 0.0, 0.002) << name;
    }
  }
}

TEST(BertForPreTraining, DropoutActsInTrainModeOnly) {
  BertForPreTraining model(BertConfig::tiny().vocab_size(50));
  Tensor ids = ids_tensor({5, 9, 13, 2, 7, 30, 41, 3}, {2, 4});
  NoGradGuard no_grad;
  model.eval();
  Tensor eval_once = model.forward(ids).mlm_logits;
  Tensor eval_again = model.forward(ids).mlm_logits;
  EXPECT_TRUE(testing::bitwise_equal(eval_once, eval_again));
  model.train();
  Tensor trained = model.forward(ids).mlm_logits;
  EXPECT_FALSE(all_close(trained, eval_once, kModelRtol));
}

TEST(BertPreTrainingLoss, WithoutNspLabelsIsTheMlmLoss) {
  BertForPreTraining model(BertConfig::tiny().vocab_size(50));
  model.eval();
  Tensor ids = ids_tensor({5, 9, 13, 2, 7, 30, 41, 3}, {2, 4});
  Tensor labels = ids_tensor({-100, 9, -100, -100, 7, -100, -100, 3}, {2, 4});
  BertPreTrainingOutput output = model.forward(ids);
  BertPreTrainingLoss loss = bert_pretraining_loss(output, labels);
  EXPECT_FALSE(loss.nsp.defined());
  EXPECT_TRUE(loss.total.is_same(loss.mlm));
  Tensor expected = cross_entropy(output.mlm_logits.reshape({8, 50}), labels.reshape({8}));
  EXPECT_TRUE(all_close(loss.mlm, expected, 0, 0));
  EXPECT_TRUE(throws_error(
      [&] {
        bert_pretraining_loss(output, ids_tensor({1, 2}, {2}));
      },
      "mlm_labels must have shape [2, 4]"));
  EXPECT_TRUE(throws_error(
      [&] {
        bert_pretraining_loss(output, labels, ids_tensor({0, 1, 1}, {3}));
      },
      "nsp_labels must have shape [2]"));
}

TEST(BertModel, RejectsBadInputWithClearErrors) {
  BertModel model(BertConfig::tiny().vocab_size(50).max_position_embeddings(8));
  Tensor ids = ids_tensor({5, 9, 13, 2, 7, 30}, {2, 3});
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids_tensor({5, 50, 1}, {1, 3}));
      },
      "input_ids must lie in [0, 50) (vocab_size=50), got values from 1 to 50"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids_tensor({5, -1, 1}, {1, 3}));
      },
      "input_ids must lie in [0, 50)"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(zeros({1, 9}, DType::kInt64));
      },
      "sequence length 9 (input_ids shape [1, 9]) exceeds "
      "max_position_embeddings=8"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids, Tensor(), ones({2, 4}, DType::kInt64));
      },
      "attention_mask shape [2, 4] differs from input_ids shape [2, 3]"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids, ones({3, 2}, DType::kInt64));
      },
      "token_type_ids shape [3, 2] differs from input_ids shape [2, 3]"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids, full({2, 3}, 2, DType::kInt64));
      },
      "token_type_ids must lie in [0, 2) (type_vocab_size=2)"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(ids_tensor({5, 9, 13}, {3}));
      },
      "input_ids must be 2-D (batch, seq_len), got shape [3]"));
  EXPECT_TRUE(throws_error(
      [&] {
        model.forward(zeros({2, 3}));
      },
      "input_ids must hold integer token ids"));
}

}  // namespace
}  // namespace tessel::models
