#include "train/recipes/bert_mlm_fortunes.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/autograd.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "models/bert.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "parallel/ddp.h"
#include "parallel/tensor_parallel.h"
#include "text/mlm.h"
#include "text/vocab_builder.h"
#include "train/recipes/distributed.h"
#include "train/recipes/recipe_util.h"
#include "train/recipes/training_loop.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The fortunes hold about 1M words: a 2000-piece vocabulary leaves few rare tokens to memorise
// and generalises best on held-out text (one-epoch probes in bench/results/training.md: 0.44
// nats below the unigram baseline with 2000 pieces, 0.40 with 4000, 0.34 with 8000).
constexpr int64_t kVocabSize = 2000;
constexpr int64_t kMaxSeq = 128;
constexpr int64_t kHeldOutEvery = 20;     // every 20th document is held out (5%)
constexpr uint64_t kHeldOutSeed = 1;      // held-out pairs and masks do not follow --seed
constexpr double kWarmupFraction = 0.06;  // of the planned steps
constexpr double kWeightDecay = 0.01;
constexpr double kMaxGradNorm = 1.0;
constexpr int64_t kEvalBatch = 64;
constexpr int64_t kGroupBatches = 50;  // batches per window sorted by length
constexpr uint64_t kBatchOrderSalt = 0x5bd1e995;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// FNV-1a over the documents' text: the vocab cache key.
uint64_t fingerprint(const text::Corpus& corpus) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](unsigned char byte) {
    hash ^= byte;
    hash *= 1099511628211ull;
  };
  for (const std::string& document : corpus.texts()) {
    for (char c : document) mix(static_cast<unsigned char>(c));
    mix(0);
  }
  return hash;
}

models::BertConfig bert_config(const std::string& model_name) {
  TESSEL_CHECK(model_name.rfind("bert_", 0) == 0, "bert_mlm_fortunes: unknown model '", model_name,
               "'");
  return models::BertConfig::by_name(model_name.substr(5));
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& name : models::BertConfig::known_names()) names.push_back("bert_" + name);
  return names;
}

Tensor hidden_activation(const Tensor& x, const std::string& name) {
  if (name == "gelu") return gelu(x);
  if (name == "gelu_new") return gelu(x, "tanh");
  return relu(x);
}

// The examples at `indices`, cut to the longest of them (padding sits at the end), so a batch
// of short fortunes does not pay for 128 positions.
text::MlmBatch make_batch(const text::MlmDataset& dataset, const std::vector<int64_t>& indices,
                          int64_t epoch) {
  std::vector<text::MlmExample> examples;
  examples.reserve(indices.size());
  size_t longest = 1;
  for (int64_t index : indices) {
    examples.push_back(dataset.example(index, epoch));
    const auto& mask = examples.back().attention_mask;
    size_t length = 0;
    for (size_t t = 0; t < mask.size(); ++t)
      if (mask[t]) length = t + 1;
    longest = std::max(longest, length);
  }
  for (auto& example : examples) {
    example.input_ids.resize(longest);
    example.token_type_ids.resize(longest);
    example.attention_mask.resize(longest);
    example.mlm_labels.resize(longest);
  }
  return text::collate(examples);
}

// `batch` with the model's inputs and the next-sentence labels on `device`. The masked-LM labels
// stay on the host: they are read there to pick the predicted positions.
text::MlmBatch inputs_to_device(text::MlmBatch batch, Device device) {
  batch.input_ids = to_training_device(batch.input_ids, device);
  batch.token_type_ids = to_training_device(batch.token_type_ids, device);
  batch.attention_mask = to_training_device(batch.attention_mask, device);
  batch.nsp_labels = to_training_device(batch.nsp_labels, device);
  return batch;
}

int64_t pair_length(const text::MlmDataset& dataset, int64_t index) {
  const text::SentencePair& pair = dataset.pairs()[index];
  return static_cast<int64_t>(pair.a.size() + pair.b.size()) + 3;  // [CLS] A [SEP] B [SEP]
}

// `indices` sorted by sequence length (stable, so ties keep their order).
void sort_by_length(const text::MlmDataset& dataset, std::vector<int64_t>::iterator begin,
                    std::vector<int64_t>::iterator end) {
  std::stable_sort(begin, end, [&](int64_t a, int64_t b) {
    return pair_length(dataset, a) < pair_length(dataset, b);
  });
}

// The batches of one epoch, grouped by length: the shuffled order is cut into windows of
// kGroupBatches batches, each window is sorted by length and cut into batches, and the batches
// are shuffled. Batches then hold sequences of similar length and little compute goes to
// padding (fortunes average ~40 tokens, so a batch padded to its longest of 128 would waste
// most of it). Depends only on (seed, epoch), so a resumed run sees the same batches.
std::vector<std::vector<int64_t>> epoch_batches(const text::MlmDataset& dataset, int64_t batch_size,
                                                uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order = data::shuffled_indices(dataset.size(), seed, epoch);
  const int64_t window = kGroupBatches * batch_size;
  for (int64_t begin = 0; begin < dataset.size(); begin += window)
    sort_by_length(dataset, order.begin() + begin,
                   order.begin() + std::min(dataset.size(), begin + window));
  std::vector<std::vector<int64_t>> batches;
  for (int64_t begin = 0; begin < dataset.size(); begin += batch_size)
    batches.emplace_back(order.begin() + begin,
                         order.begin() + std::min(dataset.size(), begin + batch_size));
  const std::vector<int64_t> batch_order =
      data::shuffled_indices(static_cast<int64_t>(batches.size()), seed ^ kBatchOrderSalt, epoch);
  std::vector<std::vector<int64_t>> shuffled;
  shuffled.reserve(batches.size());
  for (int64_t index : batch_order) shuffled.push_back(std::move(batches[index]));
  return shuffled;
}

struct PretrainingStep {
  Tensor mlm_logits;            // (P, vocab): only the P predicted positions
  std::vector<int64_t> labels;  // (P)
  Tensor mlm_loss;              // mean over the P positions
  Tensor nsp_logits;            // (N, 2)
  Tensor nsp_loss;
};

// BertForPreTraining's forward and loss, with the MLM head (dense, GELU, LayerNorm, the decoder
// over the whole vocabulary) run only at the predicted positions: about 15% of the tokens, so the
// largest matmul of the model shrinks about 7x. Same values as the full head at those positions.
// `batch` as inputs_to_device leaves it: inputs on the model's device, mlm_labels on the host.
PretrainingStep pretraining_step(models::BertForPreTraining& model, const text::MlmBatch& batch) {
  const models::BertModelOutput encoded =
      model.bert->forward(batch.input_ids, batch.token_type_ids, batch.attention_mask);
  const Device device = encoded.sequence_output.device();
  const int64_t hidden = model.config.hidden_size();
  const auto labels = batch.mlm_labels.to_vector<int64_t>();
  std::vector<int64_t> positions;
  PretrainingStep step;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == text::kIgnoreLabel) continue;
    positions.push_back(static_cast<int64_t>(i));
    step.labels.push_back(labels[i]);
  }
  TESSEL_CHECK(!positions.empty(), "bert_mlm_fortunes: a batch has no masked position");
  const int64_t count = static_cast<int64_t>(positions.size());
  Tensor picked =
      index_select(encoded.sequence_output.reshape({-1, hidden}), 0,
                   to_training_device(from_vector<int64_t>(positions, {count}), device));
  Tensor transformed = model.transform_norm->forward(
      hidden_activation(model.transform_dense->forward(picked), model.config.hidden_act()));
  step.mlm_logits = linear(transformed, model.decoder_weight(), model.decoder_bias);
  step.mlm_loss = cross_entropy(
      step.mlm_logits, to_training_device(from_vector<int64_t>(step.labels, {count}), device));
  step.nsp_logits = model.seq_relationship->forward(encoded.pooled_output);
  step.nsp_loss = cross_entropy(step.nsp_logits, batch.nsp_labels);
  return step;
}

Evaluation evaluate_mlm(models::BertForPreTraining& model, const text::MlmDataset& held_out,
                        double baseline) {
  NoGradGuard no_grad;
  model.eval();
  const Device device = module_device(model);
  double loss_sum = 0;
  int64_t predicted = 0, correct = 0, nsp_correct = 0, sequences = 0;
  // Sums do not depend on the order: batches of similar lengths pad the least.
  std::vector<int64_t> order(held_out.size());
  for (int64_t i = 0; i < held_out.size(); ++i) order[i] = i;
  sort_by_length(held_out, order.begin(), order.end());
  for (int64_t begin = 0; begin < held_out.size(); begin += kEvalBatch) {
    const std::vector<int64_t> indices(
        order.begin() + begin, order.begin() + std::min(held_out.size(), begin + kEvalBatch));
    const text::MlmBatch batch = make_batch(held_out, indices, /*epoch=*/0);
    const PretrainingStep step = pretraining_step(model, inputs_to_device(batch, device));
    const int64_t count = static_cast<int64_t>(step.labels.size());
    loss_sum += step.mlm_loss.item<double>() * static_cast<double>(count);
    const auto guesses = argmax(step.mlm_logits, 1).to_vector<int64_t>();
    for (int64_t i = 0; i < count; ++i) correct += guesses[i] == step.labels[i];
    predicted += count;
    const auto nsp_guesses = argmax(step.nsp_logits, 1).to_vector<int64_t>();
    const auto nsp_labels = batch.nsp_labels.to_vector<int64_t>();
    for (size_t i = 0; i < nsp_labels.size(); ++i) nsp_correct += nsp_guesses[i] == nsp_labels[i];
    sequences += static_cast<int64_t>(nsp_labels.size());
  }
  model.train();
  const double mlm_loss = loss_sum / static_cast<double>(std::max<int64_t>(1, predicted));
  return {{"mlm_loss", mlm_loss},
          {"unigram_baseline", baseline},
          {"below_baseline", baseline - mlm_loss},
          {"mlm_accuracy", static_cast<double>(correct) / std::max<int64_t>(1, predicted)},
          {"nsp_accuracy", static_cast<double>(nsp_correct) / std::max<int64_t>(1, sequences)}};
}

RecipeResult run_bert_mlm_fortunes(const TrainConfig& config, std::ostream& log) {
  const auto start = Clock::now();
  begin_run(config, log);

  auto phase = Clock::now();
  const text::Corpus corpus = text::Corpus::load({*config.data});
  const text::CorpusSplit split = corpus.split(kHeldOutEvery);
  TESSEL_CHECK(!split.held_out.empty(), "bert_mlm_fortunes: '", *config.data, "' holds ",
               corpus.size(), " documents; at least ", kHeldOutEvery,
               " are needed (every 20th is held out for evaluation)");
  const text::WordPiece vocab = cached_vocab(
      split.train, kVocabSize, work_dir_for(config.work_dir, "bert_mlm_fortunes"), log);
  const auto train_documents = text::tokenize_corpus(split.train, vocab);
  const auto held_out_documents = text::tokenize_corpus(split.held_out, vocab);
  const text::MlmDataset train_data(train_documents, vocab,
                                    text::MlmOptions().max_seq(kMaxSeq).seed(config.seed));
  const text::MlmDataset held_out(held_out_documents, vocab,
                                  text::MlmOptions().max_seq(kMaxSeq).seed(kHeldOutSeed));
  const text::UnigramBaseline unigram(train_documents, vocab);
  const double baseline = unigram.cross_entropy(held_out);
  int64_t tokens = 0;
  for (int64_t i = 0; i < train_data.size(); ++i)
    tokens += static_cast<int64_t>(train_data.pairs()[i].a.size() + train_data.pairs()[i].b.size());
  char line[256];
  std::snprintf(line, sizeof(line),
                "data: %lld training and %lld held-out documents; %lld training sequences "
                "(mean %.1f tokens, max %lld), %lld held-out; vocab %lld; unigram baseline %.4f "
                "nats; %.1f s",
                static_cast<long long>(split.train.size()),
                static_cast<long long>(split.held_out.size()),
                static_cast<long long>(train_data.size()),
                static_cast<double>(tokens) / std::max<int64_t>(1, train_data.size()) + 3.0,
                static_cast<long long>(kMaxSeq), static_cast<long long>(held_out.size()),
                static_cast<long long>(vocab.size()), baseline, seconds_since(phase));
  log << line << std::endl;

  const models::BertConfig bert = bert_config(*config.model).vocab_size(vocab.size());
  models::BertForPreTraining model(bert);
  int64_t parameters = 0;
  for (const Tensor& p : model.parameters()) parameters += p.numel();
  log << "model: " << *config.model << " (" << bert.num_hidden_layers() << " layers, hidden "
      << bert.hidden_size() << ", " << bert.num_attention_heads() << " heads, ffn "
      << bert.intermediate_size() << "), " << parameters << " parameters" << std::endl;
  // --device: before the tensor-parallel copy and the optimizer are made from the parameters.
  const Device device = training_device(config);
  model.to(device);

  // Under mpirun: with --tp > 1 a tensor-parallel copy trains (and is gathered into `model` to
  // evaluate); with --dp > 1, DDP averages the gradients of the ranks' shards.
  const DistributedRun& run = distributed_run();
  std::shared_ptr<parallel::TensorParallelBertForPreTraining> tp_model;
  if (run.tp > 1) tp_model = parallel::shard_bert(model, run.tp_group_id);
  nn::Module& trained = tp_model ? static_cast<nn::Module&>(*tp_model) : model;
  const auto optimizer_holder =
      make_optimizer(config, trained.named_parameters(),
                     optim::AdamWOptions(*config.lr).weight_decay(kWeightDecay).eps(1e-6));
  optim::Optimizer& optimizer = *optimizer_holder;
  const auto ddp = make_ddp(trained);
  const int64_t batch_size = *config.batch_size;
  const int64_t batches_per_epoch = (train_data.size() + batch_size - 1) / batch_size;
  const int64_t total_steps = planned_steps(config, batches_per_epoch);
  optim::LinearWarmupDecay scheduler(
      optimizer, std::min<int64_t>(total_steps, std::llround(kWarmupFraction * total_steps)),
      total_steps);
  log << "optimizer: " << optimizer.name() << " lr " << *config.lr;
  if (*config.optimizer == "adamw") log << " weight decay " << kWeightDecay;
  log << ", gradients clipped to norm " << kMaxGradNorm << "; schedule " << scheduler.name()
      << " (warmup " << scheduler.warmup_steps() << ") over " << total_steps << " steps ("
      << batches_per_epoch << " per epoch)" << std::endl;

  std::vector<std::vector<int64_t>> batches;
  int64_t epoch_index = 0, next_batch = 0;
  TrainingTask task;
  task.model = &trained;
  task.optimizer = &optimizer;
  task.scheduler = &scheduler;
  task.batches_per_epoch = batches_per_epoch;
  task.samples_name = "sequences";
  task.start_epoch = [&](int64_t epoch, int64_t skip) {
    batches = epoch_batches(train_data, batch_size, config.seed, epoch);
    epoch_index = epoch;
    next_batch = skip;
  };
  task.train_step = [&](StepResult* result) {
    if (next_batch >= static_cast<int64_t>(batches.size())) return false;
    const std::vector<int64_t>& indices = batches[next_batch++];
    // Masks change every epoch (dynamic masking). Each data-parallel rank reads its shard.
    const text::MlmBatch batch =
        inputs_to_device(make_batch(train_data, run.shard(indices), epoch_index), device);
    if (ddp) ddp->prepare_forward();
    Tensor mlm_loss, nsp_loss;
    int64_t predicted = 0;
    if (tp_model) {
      const parallel::TensorParallelBertOutput output =
          tp_model->forward(batch.input_ids, batch.token_type_ids, batch.attention_mask);
      const models::BertPreTrainingLoss losses = parallel::tensor_parallel_bert_loss(
          output, batch.mlm_labels, batch.nsp_labels, run.tp_group_id);
      mlm_loss = losses.mlm;
      nsp_loss = losses.nsp;
      for (int64_t label : batch.mlm_labels.to_vector<int64_t>())
        predicted += label != text::kIgnoreLabel;
    } else {
      const PretrainingStep step = pretraining_step(model, batch);
      mlm_loss = step.mlm_loss;
      nsp_loss = step.nsp_loss;
      predicted = static_cast<int64_t>(step.labels.size());
    }
    // Losses normalised by the global batch's counts, so DDP's average is the global gradient.
    std::vector<double> means;
    const std::vector<Tensor> weighted = weight_by_global_counts(
        {{mlm_loss, predicted}, {nsp_loss, batch.nsp_labels.numel()}}, &means);
    const Tensor loss = add(weighted[0], weighted[1]);
    optimizer.zero_grad();
    if (ddp) ddp->prepare_for_backward({loss});
    loss.backward();
    if (ddp) ddp->finalize();
    if (tp_model) {
      clip_grad_norm_tensor_parallel(*tp_model, kMaxGradNorm, run.tp_group_id);
    } else {
      optim::clip_grad_norm(optimizer.parameters(), kMaxGradNorm);
    }
    optimizer.step();
    result->loss = run.distributed() ? means[0] + means[1] : loss.item<double>();
    result->samples = static_cast<int64_t>(indices.size());
    result->parts = {{"mlm_loss", means[0]}, {"nsp_loss", means[1]}};
    return true;
  };
  task.evaluate = [&]() {
    if (tp_model) gather_into_full_model(*tp_model, model, run.tp_group_id);
    return evaluate_mlm(model, held_out, baseline);
  };

  RecipeResult result = run_training(task, config, log);
  result.seconds = seconds_since(start);
  log << "wall time: " << result.seconds << " s" << std::endl;
  return result;
}

}  // namespace

std::string work_dir_for(const std::string& work_dir, const std::string& name) {
  if (!work_dir.empty()) return work_dir;
  const char* home = std::getenv("HOME");
  const fs::path base =
      home && *home ? fs::path(home) / ".cache" / "tessel" : fs::path("/tmp") / "tessel";
  return (base / name).string();
}

text::WordPiece cached_vocab(const text::Corpus& corpus, int64_t vocab_size,
                             const std::string& work_dir, std::ostream& log) {
  char name[64];
  std::snprintf(name, sizeof(name), "vocab-%lld-%016" PRIx64 ".txt",
                static_cast<long long>(vocab_size), fingerprint(corpus));
  const fs::path path = fs::path(work_dir) / name;
  if (fs::exists(path)) {
    text::WordPiece vocab = text::WordPiece::from_file(path.string());
    log << "vocab: " << vocab.size() << " tokens from " << path.string() << std::endl;
    return vocab;
  }
  const auto start = Clock::now();
  text::VocabBuilder builder(text::VocabBuilderOptions().vocab_size(vocab_size));
  for (const std::string& document : corpus.texts()) builder.add_text(document);
  const std::vector<std::string> tokens = builder.build();
  std::error_code error;
  fs::create_directories(work_dir, error);
  TESSEL_CHECK(!error, "--work_dir: cannot create '", work_dir, "': ", error.message());
  // Written under a temporary name and renamed, so a crash never leaves half a vocab behind.
  const fs::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  text::write_vocab(tokens, temporary.string());
  fs::rename(temporary, path, error);
  TESSEL_CHECK(!error, "--work_dir: cannot rename '", temporary.string(), "' to '", path.string(),
               "': ", error.message());
  char line[64];
  std::snprintf(line, sizeof(line), " (%.1f s)", seconds_since(start));
  log << "vocab: built " << tokens.size() << " tokens from " << builder.num_words()
      << " words, cached in " << path.string() << line << std::endl;
  return text::WordPiece(tokens, text::BasicTokenizerOptions(), path.string());
}

Recipe bert_mlm_fortunes_recipe() {
  Recipe recipe;
  recipe.name = "bert_mlm_fortunes";
  recipe.description =
      "BERT pre-training (masked LM + next sentence) on Debian's fortunes: WordPiece vocab of "
      "2000 built from the training part and cached in --work_dir, pairs of up to 128 tokens "
      "batched by length, AdamW, linear warmup-decay; held-out masked-LM loss and accuracy vs "
      "the unigram baseline";
  recipe.data_help =
      "fortune files or a folder of them (entries between '%' lines), or any text files";
  recipe.defaults.model = "bert_mini";
  recipe.defaults.data = text::kFortunesDir;
  recipe.defaults.batch_size = 32;
  recipe.defaults.lr = 1e-3;
  recipe.defaults.epochs = 16;
  recipe.models = model_names();
  recipe.optimizers = {"adamw", "sgd", "adam"};
  recipe.supports_checkpoints = true;
  recipe.run = run_bert_mlm_fortunes;
  return recipe;
}

}  // namespace tessel::train
