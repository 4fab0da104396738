#include "train/recipes/bert_mlm_fortunes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/autocast.h"
#include "core/error.h"
#include "models/bert.h"
#include "optim/lr_scheduler.h"
#include "parallel/zero.h"
#include "text/corpus.h"
#include "text/mlm.h"
#include "train/engine/checkpointer.h"
#include "train/engine/run_layout.h"
#include "train/engine/setup.h"
#include "train/engine/status_log.h"
#include "train/engine/training_memory.h"
#include "train/engine/training_plan.h"
#include "train/tasks/bert_pretraining.h"

namespace tessel::train {
namespace {

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

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& name : models::BertConfig::known_names()) names.push_back("bert_" + name);
  return names;
}

RecipeResult run_bert_mlm_fortunes(const TrainConfig& config, const RunLayout& layout,
                                   std::ostream& log) {
  const auto start = Clock::now();
  begin_run(config, log);
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
                static_cast<long long>(vocab.size()), baseline, seconds_since(start));
  log << line << std::endl;

  TESSEL_CHECK(config.model->rfind("bert_", 0) == 0, "bert_mlm_fortunes: unknown model '",
               *config.model, "'");
  models::BertConfig bert = models::BertConfig::by_name(config.model->substr(5));
  bert.vocab_size(vocab.size());
  if (config.dropout) bert.dropout(*config.dropout);  // --dropout=0: ranks agree with one process
  models::BertForPreTraining model(bert);
  int64_t parameters = 0;
  for (const Tensor& p : model.parameters()) parameters += p.numel();
  log << "model: " << *config.model << " (" << bert.num_hidden_layers() << " layers, hidden "
      << bert.hidden_size() << ", " << bert.num_attention_heads() << " heads, ffn "
      << bert.intermediate_size() << "), " << parameters << " parameters" << std::endl;
  // --device: before the tensor-parallel copy and the optimizer are made from the parameters.
  const Device device = training_device(config);
  model.to(device);
  // The --tp split and DDP over --dp, or a --plan's own ops.
  ParallelBert parallel_bert(model, layout, *config.batch_size, kMaxSeq);
  nn::Module& trained = parallel_bert.trained();
  // --zero: a ZeroOptimizer over the dp group, whose parts this optimizer updates.
  const auto optimizer_holder =
      make_run_optimizer(layout, trained, [&](const optim::NamedTensors& parameters) {
        return make_optimizer(config, parameters,
                              optim::AdamWOptions(*config.lr).weight_decay(kWeightDecay).eps(1e-6));
      });
  optim::Optimizer& optimizer = *optimizer_holder;
  parallel_bert.hand_gradients_to(optimizer);  // --zero=2 or 3 beside a plan's own ops
  const int64_t batch_size = *config.batch_size;
  // A plan's ops take whole batches only: an epoch's partial batch is skipped.
  const int64_t batches_per_epoch = parallel_bert.runs_plan()
                                        ? train_data.size() / batch_size
                                        : (train_data.size() + batch_size - 1) / batch_size;
  const TrainingPlan plan(config, batches_per_epoch);
  optim::LinearWarmupDecay scheduler(
      optimizer,
      std::min<int64_t>(plan.total_steps, std::llround(kWarmupFraction * plan.total_steps)),
      plan.total_steps);
  log << "optimizer: " << optimizer.name() << " lr " << *config.lr;
  if (*config.optimizer == "adamw") log << " weight decay " << kWeightDecay;
  log << ", gradients clipped to norm " << kMaxGradNorm << "; schedule " << scheduler.name()
      << " (warmup " << scheduler.warmup_steps() << ") over " << plan.total_steps << " steps ("
      << plan.batches_per_epoch << " per epoch)" << std::endl;

  StatusLog status(config, layout, plan, optimizer, log, "sequences");
  Checkpointer checkpointer(config, layout, plan, trained, optimizer, &scheduler, status);
  int64_t step = checkpointer.resume();
  TrainingMemory memory(config, trained, optimizer, log);  // --memory_budget, --memory_policy
  status.watch(memory);

  trained.train();
  for (int64_t epoch = plan.epoch_of(step); epoch <= plan.epochs && !plan.done(step); ++epoch) {
    auto batches = epoch_batches(train_data, batch_size, config.seed, epoch - 1);
    if (parallel_bert.runs_plan())
      batches.erase(std::remove_if(batches.begin(), batches.end(),
                                   [&](const auto& rows) {
                                     return static_cast<int64_t>(rows.size()) != batch_size;
                                   }),
                    batches.end());
    status.begin_epoch();
    for (size_t next = plan.batches_done(epoch, step); next < batches.size() && !plan.done(step);
         ++next) {
      double loss_value = 0, mlm_loss = 0, nsp_loss = 0;
      {  // the batch and the graph are freed before the status line reads the memory in use
        // Masks change every epoch (dynamic masking). Each data-parallel rank reads its shard.
        const text::MlmBatch batch =
            inputs_to_device(make_batch(train_data, parallel_bert.shard(batches[next]), epoch - 1,
                                        parallel_bert.padded_length()),
                             device);
        PretrainingLoss loss;
        {
          // --precision=bf16: the forward pass's products in bf16 (core/autocast.h).
          AutocastGuard autocast(DType::kBFloat16, config.precision == "bf16");
          loss = parallel_bert.loss(batch);
        }
        optimizer.zero_grad();
        loss.total.backward();  // with --dp, DDP's average over the ranks finishes inside
        parallel_bert.clip_gradients(kMaxGradNorm, optimizer);
        optimizer.step();
        loss_value = loss.value;
        mlm_loss = loss.mlm;
        nsp_loss = loss.nsp;
      }
      scheduler.step();
      ++step;
      memory.after_step(log);
      // Under a plan the step's loss is MLM + NSP in one (the plan's step gives their sum).
      status.step(step, epoch, loss_value, static_cast<int64_t>(batches[next].size()),
                  parallel_bert.runs_plan()
                      ? NamedValues{}
                      : NamedValues{{"mlm_loss", mlm_loss}, {"nsp_loss", nsp_loss}});
      if (plan.evaluates_at(step))
        status.eval(step, epoch, parallel_bert.evaluate(held_out, baseline, batch_size));
      checkpointer.maybe_save(step);
    }
    if (plan.ends_epoch(epoch, step)) {
      if (!status.evaluated_at(step))
        status.eval(step, epoch, parallel_bert.evaluate(held_out, baseline, batch_size));
      checkpointer.save(step);
    }
  }
  if (!status.evaluated_at(step))
    status.eval(step, plan.epoch_of(step), parallel_bert.evaluate(held_out, baseline, batch_size));
  checkpointer.save(step);

  RecipeResult result = status.finish(step);
  result.resumed_from_step = checkpointer.resumed_from();
  result.last_checkpoint = checkpointer.last_saved();
  result.seconds = seconds_since(start);
  log << "wall time: " << result.seconds << " s" << std::endl;
  return result;
}

}  // namespace

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
  recipe.has_dropout = true;
  recipe.run = run_bert_mlm_fortunes;
  return recipe;
}

}  // namespace tessel::train
