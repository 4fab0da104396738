#include "models/trace.h"

#include <algorithm>

#include "core/error.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/ops.h"

namespace tessel::models {

using planner::Graph;
using planner::ModelSpec;

namespace {
constexpr const char* kBertPrefix = "bert_";

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
  return text;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Tensor meta_tensor(const Shape& sizes, DType dtype) {
  return empty(sizes, TensorOptions(dtype).device(Device::meta()));
}

}  // namespace

std::vector<std::string> known_models() {
  std::vector<std::string> names = resnet_names();
  for (const auto& name : shufflenet_names()) names.push_back(name);
  for (const auto& name : BertConfig::known_names()) names.push_back(kBertPrefix + name);
  return names;
}

planner::ModuleTraceOptions bert_pretraining_step(int64_t batch, int64_t seq) {
  const Shape tokens{batch, seq};
  std::vector<planner::StepInput> inputs = {{"input_ids", tokens},
                                            {"token_type_ids", tokens},
                                            {"attention_mask", tokens},
                                            {"mlm_labels", tokens},
                                            {"nsp_labels", {batch}}};
  auto step = [](nn::Module& module, const std::vector<Tensor>& in) {
    auto* model = dynamic_cast<BertForPreTraining*>(&module);
    TESSEL_CHECK(model != nullptr, "bert_pretraining_step: the module is a ", module.name(),
                 ", not a BertForPreTraining");
    return bert_pretraining_loss(model->forward(in.at(0), in.at(1), in.at(2)), in.at(3), in.at(4))
        .total;
  };
  return planner::ModuleTraceOptions(std::move(inputs), step).name("bert_pretraining");
}

Graph trace_model(const ModelSpec& spec) {
  const std::vector<std::string> names = known_models();
  TESSEL_CHECK(contains(names, spec.name), "unknown model '", spec.name, "' (known: ", join(names),
               ")");
  TESSEL_CHECK(spec.batch >= 1, "batch must be at least 1, got ", spec.batch);
  const int64_t batch = spec.batch;
  if (planner::is_bert(spec.name)) {
    BertConfig config = BertConfig::by_name(spec.name.substr(std::string(kBertPrefix).size()));
    TESSEL_CHECK(spec.seq >= 1 && spec.seq <= config.max_position_embeddings(),
                 "seq must be in [1, ", config.max_position_embeddings(), "] for ", spec.name,
                 ", got ", spec.seq);
    // The encoder layers are identical: one layer is built and run num_hidden_layers times, and
    // each run then gets parameters of its own (bert.encoder.layer.<i>.*), so tracing BERT-large
    // initialises 1/24 of its layer weights on the CPU instead of all of them.
    const int64_t layers = config.num_hidden_layers();
    BertConfig one_layer = config;
    one_layer.num_hidden_layers(std::min<int64_t>(layers, 1));
    BertForPreTraining model(one_layer);
    for (int64_t i = 1; i < layers; ++i) model.bert->layers->push_back((*model.bert->layers)[0]);
    model.to(Device::meta());
    Tensor ids = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor types = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor mask = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor mlm_labels = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor nsp_labels = meta_tensor({batch}, DType::kInt64);
    Graph graph = planner::trace_graph(
        [&] { bert_pretraining_loss(model.forward(ids, types, mask), mlm_labels, nsp_labels); },
        model.named_parameters(),
        {{"input_ids", ids},
         {"token_type_ids", types},
         {"attention_mask", mask},
         {"mlm_labels", mlm_labels},
         {"nsp_labels", nsp_labels}},
        batch);
    planner::untie_repeated_parameters(graph, "bert.encoder.layer.0.", "bert.encoder.layer.",
                                       layers);
    graph.model = spec.name;
    return graph;
  }
  TESSEL_CHECK(spec.image_size >= 1, "image_size must be at least 1, got ", spec.image_size);
  TESSEL_CHECK(spec.num_classes >= 1, "num_classes must be at least 1, got ", spec.num_classes);
  std::shared_ptr<nn::Module> net = make_vision_model(spec);
  net->to(Device::meta());
  Tensor images =
      meta_tensor({batch, spec.in_channels, spec.image_size, spec.image_size}, DType::kFloat32);
  Tensor labels = meta_tensor({batch}, DType::kInt64);
  Graph graph = planner::trace_graph([&] { cross_entropy(net->forward(images), labels); },
                                     net->named_parameters(),
                                     {{"images", images}, {"labels", labels}}, batch);
  graph.model = spec.name;
  return graph;
}

std::shared_ptr<nn::Module> make_vision_model(const planner::ModelSpec& spec) {
  TESSEL_CHECK(spec.in_channels >= 1, "in_channels must be at least 1, got ", spec.in_channels);
  if (contains(resnet_names(), spec.name))
    return make_resnet(spec.name, ResNetOptions()
                                      .num_classes(spec.num_classes)
                                      .in_channels(spec.in_channels)
                                      .small_image_stem(spec.small_image_stem));
  return make_shufflenet(spec.name, ShuffleNetV2Options()
                                        .num_classes(spec.num_classes)
                                        .in_channels(spec.in_channels)
                                        .small_image_stem(spec.small_image_stem));
}

}  // namespace tessel::models
