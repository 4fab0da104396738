// BERT pre-training (masked LM + next-sentence prediction) on a dp x tp layout: batches grouped
// by length, the loss of one step (the MLM head run only at the masked positions), gradient
// clipping, held-out evaluation, and the WordPiece vocabulary cache. With tp > 1 a shard_bert
// copy trains (heads, MLP and vocabulary split); with dp > 1 DDP averages its gradients, finishing
// inside backward; under a --plan with a tensor-parallel group the plan's own ops train
// (parallel::ParallelModule). A training step then reads as on one process:
//   ParallelBert bert(model, layout, batch_size, max_seq);
//   PretrainingLoss loss = bert.loss(batch);
//   optimizer.zero_grad();  loss.total.backward();  bert.clip_gradients(1.0, optimizer);
//   optimizer.step();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "models/bert.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/tensor_parallel.h"
#include "text/corpus.h"
#include "text/mlm.h"
#include "text/wordpiece.h"
#include "train/engine/run_layout.h"
#include "train/engine/status_log.h"

namespace tessel::parallel {
class DistributedDataParallel;
}  // namespace tessel::parallel

namespace tessel::train {

class PlannedModule;

// The examples at `indices` (masks of `epoch`), cut to the longest of them (padding sits at the
// end), so a batch of short fortunes does not pay for 128 positions; with `padded_length` > 0
// padded to that many positions instead (a plan's fixed shape; no example may be longer).
text::MlmBatch make_batch(const text::MlmDataset& dataset, const std::vector<int64_t>& indices,
                          int64_t epoch, int64_t padded_length = 0);
// `batch` with the model's inputs and the next-sentence labels on `device`. The masked-LM labels
// stay on the host: they are read there to pick the predicted positions.
text::MlmBatch inputs_to_device(text::MlmBatch batch, Device device);
// The batches of one epoch, as indices into `dataset`, grouped by length: the shuffled order is
// cut into windows of 50 batches, each window is sorted by length and cut into batches, and the
// batches are shuffled. Batches then hold sequences of similar length and little compute goes to
// padding. Depends only on (seed, epoch), so a resumed run sees the same batches.
std::vector<std::vector<int64_t>> epoch_batches(const text::MlmDataset& dataset, int64_t batch_size,
                                                uint64_t seed, int64_t epoch);
// Held-out masked-LM loss and accuracy (with the unigram `baseline` and how far below it the
// loss is) and next-sentence accuracy of `model`, in batches of `batch_size` sequences (the
// training batch: evaluation then needs no more memory than a training step's forward, so it
// fits a memory budget that training fits); back in training mode afterwards.
Evaluation evaluate_mlm(models::BertForPreTraining& model, const text::MlmDataset& held_out,
                        double baseline, int64_t batch_size);

// The WordPiece vocabulary of at most `vocab_size` tokens built from `corpus` by the vocab
// builder, cached as <work_dir>/vocab-<vocab_size>-<fingerprint of the text>.txt: built and
// written (atomically) the first time, read afterwards. Writes one line to `log` either way.
text::WordPiece cached_vocab(const text::Corpus& corpus, int64_t vocab_size,
                             const std::string& work_dir, std::ostream& log);
// $HOME/.cache/tessel (or /tmp/tessel without HOME) joined with `name`, unless `work_dir` is set.
std::string work_dir_for(const std::string& work_dir, const std::string& name);

// clip_grad_norm for a tensor-parallel model: split parameters' squares summed over the tp
// group, replicated ones counted once. Returns the total norm.
double clip_grad_norm_tensor_parallel(nn::Module& model, double max_norm, int64_t group);
// The same for `parameters`, of which those named in `split` are cut over `group` (a collective
// over it) and the others whole and equal on every rank of it. `copies`: for a cut tensor that
// several ranks of the group hold the same part of (a plan's grid over part of the ranks), how
// many do; 1 for the others.
double clip_grad_norm_split(const nn::NamedTensors& parameters, const std::set<std::string>& split,
                            parallel::Communicator& group, double max_norm,
                            const std::map<std::string, int>& copies = {});
// Copies a tensor-parallel model's parameters into the full model of the same names, gathering
// split ones over the tp group (a collective): evaluation runs on the full model.
void gather_into_full_model(nn::Module& sharded, nn::Module& full, int64_t group);

struct PretrainingLoss {
  Tensor total;      // what backward starts from: MLM + NSP, weighted by the global counts
  double value = 0;  // the global batch's MLM + NSP loss, the same on every rank
  // Its parts; under a plan's own ops NaN (the plan's step gives their sum only).
  double mlm = 0, nsp = 0;
};

// Whether this run trains BERT through its plan's own ops (parallel::ParallelModule): --plan with
// a tensor-parallel group (per-op degrees lay the ranks out as one: resolve_layout), beside ZeRO
// on a dp x tp grid or over the line of per-op degrees.
bool runs_planned_bert(const RunLayout& layout);

class ParallelBert {
 public:
  // `model` is on the training device and outlives this. With tp > 1 a tensor-parallel copy is
  // made (and gathered back into `model` to evaluate); with dp > 1 DDP wraps what trains. Under
  // runs_planned_bert, a copy of `model` runs the plan's ops as priced, on global batches of
  // `batch_size` sequences padded to the plan's length, which must hold `max_seq` positions
  // (errors say which plan to make); `model` is filled whole to evaluate. A collective call.
  ParallelBert(models::BertForPreTraining& model, const RunLayout& layout, int64_t batch_size,
               int64_t max_seq);
  ~ParallelBert();
  // What the optimizer updates and checkpoints hold: the plan's shards, the tensor-parallel copy,
  // or `model`.
  nn::Module& trained();
  // Whether batches have the plan's fixed shape: global batches of exactly batch_size sequences
  // (a partial one is skipped), padded_length() positions each.
  bool runs_plan() const { return planned_ != nullptr; }
  // Under a plan beside ZeRO stage 2 or 3: ZeRO reduces the plan's gradients over dp
  // (PlannedModule::hand_gradients_to). Call once `optimizer` is made over trained().
  void hand_gradients_to(optim::Optimizer& optimizer);
  int64_t padded_length() const;
  // This rank's rows of a global batch: its data-parallel shard, or under a plan the rows its
  // ops read where they split the batch.
  std::vector<int64_t> shard(const std::vector<int64_t>& batch) const;
  // The loss of `batch` (this rank's rows, as inputs_to_device leaves them), each part a mean
  // over the global batch's masked positions or sequences.
  PretrainingLoss loss(const text::MlmBatch& batch);
  // Scales the gradients to a total norm of at most `max_norm` (over the tp group's split
  // parameters too); returns the norm before. Under ZeRO stages 2 and 3 (`optimizer` a
  // parallel::ZeroOptimizer) the gradients are the optimizer's parts, over the dp group too.
  double clip_gradients(double max_norm, optim::Optimizer& optimizer);
  Evaluation evaluate(const text::MlmDataset& held_out, double baseline, int64_t batch_size);

 private:
  models::BertForPreTraining& model_;
  const RunLayout& layout_;
  std::shared_ptr<models::BertForPreTraining> tp_model_;  // this rank's shard with tp > 1
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  // Under runs_planned_bert: the plan's shards, the group whose ranks read different rows where
  // ops split the batch, and the one that cuts the parameters.
  std::shared_ptr<PlannedModule> planned_;
  std::shared_ptr<parallel::Communicator> planned_rows_, planned_cuts_;
};

}  // namespace tessel::train
