#include "train/tasks/bert_pretraining.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "core/autograd.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "models/trace.h"
#include "ops/ops.h"
#include "optim/clip_grad.h"
#include "parallel/ddp.h"
#include "parallel/parallelize.h"
#include "parallel/zero.h"
#include "text/vocab_builder.h"
#include "train/engine/setup.h"
#include "train/tasks/planned_module.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

Tensor hidden_activation(const Tensor& x, const std::string& name) {
  if (name == "gelu") return gelu(x);
  if (name == "gelu_new") return gelu(x, "tanh");
  return relu(x);
}

}  // namespace

// The examples at `indices`, cut to the longest of them (padding sits at the end), so a batch
// of short fortunes does not pay for 128 positions, or padded to `padded_length`.
text::MlmBatch make_batch(const text::MlmDataset& dataset, const std::vector<int64_t>& indices,
                          int64_t epoch, int64_t padded_length) {
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
  if (padded_length > 0) {
    TESSEL_CHECK(static_cast<int64_t>(longest) <= padded_length, "make_batch: an example of ",
                 longest, " tokens does not fit the ", padded_length, " positions asked for");
    longest = static_cast<size_t>(padded_length);
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

Evaluation evaluate_mlm(models::BertForPreTraining& model, const text::MlmDataset& held_out,
                        double baseline, int64_t batch_size) {
  TESSEL_CHECK(batch_size >= 1, "evaluate_mlm: batch_size must be at least 1, got ", batch_size);
  NoGradGuard no_grad;
  model.eval();
  const Device device = module_device(model);
  double loss_sum = 0;
  int64_t predicted = 0, correct = 0, nsp_correct = 0, sequences = 0;
  // Sums do not depend on the order: batches of similar lengths pad the least.
  std::vector<int64_t> order(held_out.size());
  for (int64_t i = 0; i < held_out.size(); ++i) order[i] = i;
  sort_by_length(held_out, order.begin(), order.end());
  for (int64_t begin = 0; begin < held_out.size(); begin += batch_size) {
    const std::vector<int64_t> indices(
        order.begin() + begin, order.begin() + std::min(held_out.size(), begin + batch_size));
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

double clip_grad_norm_tensor_parallel(nn::Module& model, double max_norm, int64_t group) {
  std::set<std::string> split;
  for (const auto& entry : parallel::tensor_parallel_split_dims(model)) split.insert(entry.first);
  return clip_grad_norm_split(model.named_parameters(), split, *parallel::tp_group(group),
                              max_norm);
}

double clip_grad_norm_split(const nn::NamedTensors& parameters, const std::set<std::string>& split,
                            parallel::Communicator& group, double max_norm,
                            const std::map<std::string, int>& copies) {
  NoGradGuard no_grad;
  double split_squares = 0, replicated_squares = 0;
  std::vector<Tensor> grads;
  for (const auto& [name, parameter] : parameters) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    grads.push_back(grad);
    double squares = sum(mul(grad, grad)).item<double>();
    auto copied = copies.find(name);
    if (copied != copies.end()) squares /= copied->second;
    (split.count(name) ? split_squares : replicated_squares) += squares;
  }
  // On the group's device (NCCL moves GPU tensors only), read back on the CPU.
  Tensor total = from_vector<double>({split_squares}, {1}).to(group.device());
  group.all_reduce(total, parallel::ReduceOp::kSum);
  const double norm =
      std::sqrt(total.to(Device::cpu()).to_vector<double>()[0] + replicated_squares);
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0 || std::isnan(scale))
    for (Tensor& grad : grads) grad.mul_(scale);
  return norm;
}

void gather_into_full_model(nn::Module& sharded, nn::Module& full, int64_t group) {
  NoGradGuard no_grad;
  const auto split = parallel::tensor_parallel_split_dims(sharded);
  std::map<std::string, Tensor> targets;
  for (const auto& [name, parameter] : full.named_parameters()) targets[name] = parameter;
  auto& comm = *parallel::tp_group(group);
  for (const auto& [name, parameter] : sharded.named_parameters()) {
    auto target = targets.find(name);
    TESSEL_CHECK(target != targets.end(), "gather_into_full_model: the full model has no ",
                 "parameter '", name, "'");
    auto dim = split.find(name);
    Tensor value = dim == split.end() ? parameter.detach()
                                      : parallel::gather_shards(parameter, dim->second, comm);
    TESSEL_CHECK(value.sizes() == target->second.sizes(), "gather_into_full_model: '", name,
                 "' gathers to ", shape_str(value.sizes()), " but the full model's is ",
                 shape_str(target->second.sizes()));
    Tensor copy = target->second;
    copy.copy_(value);
  }
}

}  // namespace tessel::train

namespace tessel::train {

bool runs_planned_bert(const RunLayout& layout) { return layout.plan && layout.tp > 1; }

ParallelBert::ParallelBert(models::BertForPreTraining& model, const RunLayout& layout,
                           int64_t batch_size, int64_t max_seq)
    : model_(model), layout_(layout) {
  if (runs_planned_bert(layout)) {
    const planner::PlanFile& plan = *layout.plan;
    auto make_plan = [&] {
      return "make a plan for it (bazel run //parallel:plan -- --model=" + plan.model +
             " --devices=" + std::to_string(plan.devices) +
             " --batch=" + std::to_string(batch_size) + " --seq=" + std::to_string(max_seq) +
             " --out=FILE)";
    };
    TESSEL_CHECK(plan.batch == batch_size && plan.seq >= max_seq, "--plan: the plan was made for ",
                 plan.batch, " sequences of ", plan.seq, " positions, this run trains batches of ",
                 batch_size, " sequences of up to ", max_seq, " positions: ", make_plan());
    // Dropout at 0 runs no op, so the plan's trace must agree with this run about dropout.
    const bool plan_drops = std::any_of(plan.ops.begin(), plan.ops.end(),
                                        [](const auto& op) { return op.op == "dropout"; });
    const bool run_drops =
        model.config.hidden_dropout_prob() > 0 || model.config.attention_probs_dropout_prob() > 0;
    TESSEL_CHECK(plan_drops == run_drops, "--plan: the plan was traced ",
                 plan_drops ? "with" : "without", " dropout, this run trains ",
                 run_drops ? "with" : "without",
                 plan_drops ? " it: train with dropout (//parallel:plan traces BERT with its "
                              "default dropout) or make a plan from a trace without dropout"
                            : " it: train with --dropout=0 or make a plan from a trace with "
                              "dropout (//parallel:plan traces BERT so)");
    // The plan's cuts must divide this run's tensors (its vocabulary comes from the data, not
    // from the model's name the plan was made for).
    std::map<std::string, Shape> shapes;
    for (const auto& [name, parameter] : model.named_parameters()) shapes[name] = parameter.sizes();
    for (const planner::PlanFile::Parameter& cut : plan.parameters) {
      auto found = shapes.find(cut.name);
      TESSEL_CHECK(found != shapes.end(), "--plan: the plan cuts a parameter '", cut.name,
                   "' that ", plan.model, " does not have: ", make_plan());
      if (cut.split_dim < 0) continue;
      const Shape& shape = found->second;
      TESSEL_CHECK(
          cut.split_dim < static_cast<int>(shape.size()) && shape[cut.split_dim] % cut.parts == 0,
          "--plan: the plan cuts ", cut.name, " in ", cut.parts, " parts along dim ", cut.split_dim,
          ", but this run's is ", shape_str(shape),
          " (this recipe's vocabulary comes from the data): ", make_plan());
    }
    // The copy the plan runs turns into meta tensors; `model` stays whole for evaluation. Its
    // initialisation does not draw from the training's random-number stream.
    const RngState rng = get_rng_state();
    auto traced = std::make_shared<models::BertForPreTraining>(model.config);
    set_rng_state(rng);
    traced->to(module_device(model));
    traced->load_state_dict(model.state_dict());
    traced->train(model.is_training());
    // Per-op degrees run over one group of every rank (resolve_layout lays them out as tp).
    planned_cuts_ = layout.tp_device_group;
    planned_rows_ = runs_on_one_line(plan) ? layout.tp_device_group : layout.dp_device_group;
    auto parallel = std::make_shared<parallel::ParallelModule>(
        traced, plan.ops, planned_rows_, planned_cuts_,
        models::bert_pretraining_step(plan.batch, plan.seq));
    std::shared_ptr<nn::Module> evaluated(&model_, [](nn::Module*) {});
    planned_ = std::make_shared<PlannedModule>(std::move(parallel), std::move(evaluated));
    return;  // the plan's ops reduce over dp themselves (or ZeRO: hand_gradients_to)
  }
  if (layout.tp > 1) tp_model_ = models::shard_bert(model, layout.tp_group_id);
  ddp_ = make_ddp(layout, trained());
}

ParallelBert::~ParallelBert() = default;

nn::Module& ParallelBert::trained() {
  if (planned_) return *planned_;
  return tp_model_ ? static_cast<nn::Module&>(*tp_model_) : model_;
}

void ParallelBert::hand_gradients_to(optim::Optimizer& optimizer) {
  if (planned_) planned_->hand_gradients_to(optimizer);
}

int64_t ParallelBert::padded_length() const { return planned_ ? layout_.plan->seq : 0; }

std::vector<int64_t> ParallelBert::shard(const std::vector<int64_t>& batch) const {
  if (!planned_) return layout_.shard(batch);
  const int64_t rows = static_cast<int64_t>(batch.size());
  const int parts = planned_rows_->size();
  const int64_t begin = parallel::part_start(rows, parts, planned_rows_->rank());
  return std::vector<int64_t>(
      batch.begin() + begin,
      batch.begin() + begin + parallel::part_rows(rows, parts, planned_rows_->rank()));
}

PretrainingLoss ParallelBert::loss(const text::MlmBatch& batch) {
  if (planned_) {
    PretrainingLoss loss;
    const Device device = batch.input_ids.device();
    loss.total = planned_->loss({batch.input_ids, batch.token_type_ids, batch.attention_mask,
                                 to_training_device(batch.mlm_labels, device), batch.nsp_labels});
    loss.value = loss.total.item<double>();
    loss.mlm = loss.nsp = std::nan("");
    return loss;
  }
  Tensor mlm_loss, nsp_loss;
  int64_t predicted = 0;
  if (tp_model_) {
    const models::BertPreTrainingLoss losses = models::bert_pretraining_loss(
        tp_model_->forward(batch.input_ids, batch.token_type_ids, batch.attention_mask),
        batch.mlm_labels, batch.nsp_labels);
    mlm_loss = losses.mlm;
    nsp_loss = losses.nsp;
    for (int64_t label : batch.mlm_labels.to_vector<int64_t>())
      predicted += label != text::kIgnoreLabel;
  } else {
    const PretrainingStep step = pretraining_step(model_, batch);
    mlm_loss = step.mlm_loss;
    nsp_loss = step.nsp_loss;
    predicted = static_cast<int64_t>(step.labels.size());
  }
  // Normalised by the global batch's counts, so DDP's average is the global gradient.
  std::vector<double> means;
  const std::vector<Tensor> weighted = weight_by_global_counts(
      layout_, {{mlm_loss, predicted}, {nsp_loss, batch.nsp_labels.numel()}}, &means);
  PretrainingLoss loss;
  loss.total = add(weighted[0], weighted[1]);
  loss.value = layout_.distributed() ? means[0] + means[1] : loss.total.item<double>();
  loss.mlm = means[0];
  loss.nsp = means[1];
  return loss;
}

double ParallelBert::clip_gradients(double max_norm, optim::Optimizer& optimizer) {
  auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(&optimizer);
  if (planned_) {
    std::set<std::string> split;
    std::map<std::string, int> copies;
    for (const auto& entry : planned_->parallel().split_dims()) {
      split.insert(entry.first);
      copies[entry.first] = planned_->parallel().shard_copies(entry.first);
    }
    // ZeRO's stages 2 and 3 hold each rank's part of the gradients only.
    if (zero && zero->stage() != parallel::ZeroStage::kOptimizerState)
      return zero->clip_grad_norm(max_norm, *planned_cuts_, split);
    return clip_grad_norm_split(planned_->named_parameters(), split, *planned_cuts_, max_norm,
                                copies);
  }
  if (zero && zero->stage() != parallel::ZeroStage::kOptimizerState) {
    if (!tp_model_) return zero->clip_grad_norm(max_norm);
    std::set<std::string> split;
    for (const auto& entry : parallel::tensor_parallel_split_dims(*tp_model_))
      split.insert(entry.first);
    return zero->clip_grad_norm(max_norm, *parallel::tp_group(layout_.tp_group_id), split);
  }
  if (tp_model_) return clip_grad_norm_tensor_parallel(*tp_model_, max_norm, layout_.tp_group_id);
  return optim::clip_grad_norm(model_.parameters(), max_norm);
}

Evaluation ParallelBert::evaluate(const text::MlmDataset& held_out, double baseline,
                                  int64_t batch_size) {
  if (planned_) planned_->gathered();  // fills model_ with whole tensors
  if (tp_model_) gather_into_full_model(*tp_model_, model_, layout_.tp_group_id);
  return evaluate_mlm(model_, held_out, baseline, batch_size);
}

}  // namespace tessel::train
