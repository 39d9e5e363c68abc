// Tests of include/wlb/sim/step_time.hpp: 1F1B schedules computed by hand, the step split over
// DP ranks, the model's stage costs, and bad inputs.
#include "wlb/sim/step_time.hpp"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace step_time_test {

using ::testing::HasSubstr;

double Makespan(const std::vector<StageTimes>& mbs, int stages) {
  absl::StatusOr<double> t = Simulate1F1B(mbs, stages);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : -1.0;
}

TEST(Simulate1F1BTest, OneStageRunsEverythingBackToBack) {
  EXPECT_DOUBLE_EQ(Makespan({{1, 2}, {3, 4}, {0.5, 0.25}}, 1), 10.75);
  EXPECT_DOUBLE_EQ(Makespan({}, 3), 0.0);
}

TEST(Simulate1F1BTest, EqualMicroBatchesTakeMPlusPMinusOneSlots) {
  // With equal micro-batches 1F1B takes (m + p - 1) x (f + b).
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 4, 7, 16}) {
      const std::vector<StageTimes> mbs(m, StageTimes{1.0, 2.0});
      EXPECT_DOUBLE_EQ(Makespan(mbs, p), (m + p - 1) * 3.0) << "p " << p << " m " << m;
    }
  }
}

TEST(Simulate1F1BTest, FewerMicroBatchesThanStages) {
  // One micro-batch: forward down 4 stages, backward up: 4 x 1 + 4 x 2.
  EXPECT_DOUBLE_EQ(Makespan({{1, 2}}, 4), 12.0);
  // Two micro-batches on four stages (traced by hand: stage 0 ends with B1 at [13, 15]).
  EXPECT_DOUBLE_EQ(Makespan({{1, 2}, {1, 2}}, 4), 15.0);
}

TEST(Simulate1F1BTest, OneHeavyMicroBatchAtEachPosition) {
  // Two stages, two micro-batches (1, 2) with one of them heavy (2, 4). Traced by hand:
  //  heavy first: S0 F0 [0,2]; S1 F0 [2,4] B0 [4,8]; S0 F1 [2,3] B0 [8,12]; S1 F1 [8,9]
  //  B1 [9,11]; S0 B1 [12,14].
  //  heavy second: S0 F0 [0,1]; S1 F0 [1,2] B0 [2,4]; S0 F1 [1,3] B0 [4,6]; S1 F1 [4,6]
  //  B1 [6,10]; S0 B1 [10,14].
  EXPECT_DOUBLE_EQ(Makespan({{2, 4}, {1, 2}}, 2), 14.0);
  EXPECT_DOUBLE_EQ(Makespan({{1, 2}, {2, 4}}, 2), 14.0);
  // Against equal micro-batches: (2 + 2 - 1) x 3 = 9.
  EXPECT_DOUBLE_EQ(Makespan({{1, 2}, {1, 2}}, 2), 9.0);
}

TEST(Simulate1F1BTest, MonotoneInEveryTime) {
  // Property: making any operation longer never shortens the schedule.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int iter = 0; iter < 300; ++iter) {
    const int p = 1 + iter % 6;
    const int m = 1 + static_cast<int>(rng() % 9);
    std::vector<StageTimes> mbs(m);
    for (StageTimes& t : mbs) t = {u(rng), u(rng)};
    const double base = Makespan(mbs, p);
    double work = 0.0;
    for (const StageTimes& t : mbs) work += t.forward + t.backward;
    EXPECT_GE(base, work - 1e-9);  // stage 0 runs everything
    std::vector<StageTimes> longer = mbs;
    longer[rng() % m].backward += 1.0;
    EXPECT_GE(Makespan(longer, p), base);
  }
}

TEST(SimulateStepTest, SlowestDataParallelRankSetsTheStep) {
  // PP = 2, DP = 2: rank 0 runs micro-batches 0, 1 (9 s), rank 1 runs 2, 3 (heavy: 14 s).
  const std::vector<StageTimes> mbs = {{1, 2}, {1, 2}, {2, 4}, {1, 2}};
  absl::StatusOr<double> t = SimulateStep(mbs, 2, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(*t, 14.0);
  absl::StatusOr<double> one_rank = SimulateStep(mbs, 2, 1);
  ASSERT_TRUE(one_rank.ok());
  EXPECT_DOUBLE_EQ(*one_rank, Makespan(mbs, 2));
}

TEST(SimulateStepTest, BadInputsNameTheValue) {
  const std::vector<StageTimes> three = {{1, 2}, {1, 2}, {1, 2}};
  absl::StatusOr<double> t = SimulateStep(three, 2, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("3 micro-batches"));
  EXPECT_THAT(std::string(SimulateStep(three, 0, 1).status().message()), HasSubstr("PP 0"));
  EXPECT_THAT(std::string(SimulateStep(three, 1, -3).status().message()), HasSubstr("DP -3"));
  EXPECT_THAT(std::string(Simulate1F1B(three, 0).status().message()), HasSubstr("got 0"));
  const std::vector<StageTimes> negative = {{1, 2}, {-1, 2}};
  EXPECT_THAT(std::string(Simulate1F1B(negative, 1).status().message()),
              HasSubstr("micro-batch 1: forward time must be >= 0"));
  const std::vector<StageTimes> nan = {{1, NAN}};
  EXPECT_THAT(std::string(SimulateStep(nan, 1, 1).status().message()), HasSubstr("backward"));
}

TEST(ParallelSizesTest, ParsesAndRejects) {
  absl::StatusOr<ParallelSizes> p = ParseParallelSizes("8,2,4,1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tp, 8);
  EXPECT_EQ(p->cp, 2);
  EXPECT_EQ(p->pp, 4);
  EXPECT_EQ(p->dp, 1);
  for (const char* bad : {"8,2,4", "8,2,4,1,1", "8,0,4,1", "a,2,4,1", "", "8,2,4,99999"}) {
    absl::StatusOr<ParallelSizes> r = ParseParallelSizes(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(absl::StrFormat("'%s'", bad)));
  }
}

MicroBatch Batch(const std::vector<int64_t>& lengths) {
  MicroBatch mb;
  for (size_t i = 0; i < lengths.size(); ++i) {
    mb.documents.push_back(Document{.id = static_cast<int64_t>(i), .length = lengths[i]});
    mb.tokens += lengths[i];
  }
  return mb;
}

TEST(StepTimeModelTest, StageCostsFollowTheFormula) {
  const TransformerShape shape = *FindTransformerShape("llama2-7b");
  absl::StatusOr<PipelineJob> job = MakePipelineJob(shape, {.tp = 8, .cp = 2, .pp = 4, .dp = 1});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->kernel.shape().heads, 4);
  EXPECT_EQ(job->kernel.shape().head_dim, 128);
  absl::StatusOr<StepTimeModel> model = StepTimeModel::Create(*job);
  ASSERT_TRUE(model.ok()) << model.status();
  const MicroBatch mb = Batch({40000, 30000, 5000});
  absl::StatusOr<StageTimes> t =
      model->MicroBatchTimes(mb, {.candidates = {ShardStrategy("per-doc")}});
  ASSERT_TRUE(t.ok()) << t.status();
  const CostModel flops = *CostModelFromShape(shape);
  const double linear =
      (flops.Linear(40000) + flops.Linear(30000) + flops.Linear(5000)) / (4.0 * 8 * 2 * 500e12);
  const ShardPlan plan = *PlanShards(mb, 2, ShardStrategy("per-doc"), job->kernel);
  const std::vector<double> ms = PredictRankMs(plan, job->kernel);
  const double attention = std::max(ms[0], ms[1]) * 1e-3 * 32 / 4;
  EXPECT_NEAR(t->forward, linear + attention, 1e-12);
  EXPECT_NEAR(t->backward, 2 * linear + 2.5 * attention, 1e-12);
  // At the mean rank: never slower than the slowest rank.
  absl::StatusOr<StageTimes> mean =
      model->MicroBatchTimes(mb, {.candidates = {ShardStrategy("per-doc")}, .at_mean_rank = true});
  ASSERT_TRUE(mean.ok());
  EXPECT_LE(mean->forward, t->forward);
  // Several candidates: the fastest slowest rank per micro-batch.
  absl::StatusOr<StageTimes> best = model->MicroBatchTimes(
      mb, {.candidates = {ShardStrategy("per-seq"), ShardStrategy("per-doc")}});
  absl::StatusOr<StageTimes> seq =
      model->MicroBatchTimes(mb, {.candidates = {ShardStrategy("per-seq")}});
  ASSERT_TRUE(best.ok() && seq.ok());
  EXPECT_DOUBLE_EQ(best->forward, std::min(seq->forward, t->forward));
  // An empty micro-batch costs nothing.
  absl::StatusOr<StageTimes> empty = model->MicroBatchTimes(MicroBatch{}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->forward, 0.0);
}

TEST(StepTimeModelTest, StepAndStreamAddUp) {
  absl::StatusOr<PipelineJob> job =
      MakePipelineJob(*FindTransformerShape("wlb-550m"), {.tp = 2, .cp = 2, .pp = 2, .dp = 2});
  ASSERT_TRUE(job.ok());
  absl::StatusOr<StepTimeModel> model = StepTimeModel::Create(*job);
  ASSERT_TRUE(model.ok());
  StepPlan step;
  for (const std::vector<int64_t>& l :
       {std::vector<int64_t>{9000, 100}, {4000, 4000}, {12000}, {300, 300, 300}}) {
    step.micro_batches.push_back(Batch(l));
  }
  std::vector<StageTimes> times;
  for (const MicroBatch& mb : step.micro_batches) times.push_back(*model->MicroBatchTimes(mb, {}));
  absl::StatusOr<double> t = model->StepSeconds(step, {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(*t, *SimulateStep(times, 2, 2));
  const std::vector<StepPlan> stream = {step, step};
  EXPECT_DOUBLE_EQ(*model->StreamSeconds(stream, {}), 2 * *t);
}

TEST(StepTimeModelTest, BadJobsNameTheValue) {
  const TransformerShape shape = *FindTransformerShape("llama2-7b");
  EXPECT_THAT(std::string(MakePipelineJob(shape, {.tp = 64}).status().message()),
              HasSubstr("got 64"));
  PipelineJob job = *MakePipelineJob(shape, {});
  job.sizes.pp = 0;
  EXPECT_THAT(std::string(StepTimeModel::Create(job).status().message()), HasSubstr("PP"));
  job = *MakePipelineJob(shape, {});
  job.gemm_tflops = 0;
  EXPECT_THAT(std::string(StepTimeModel::Create(job).status().message()),
              HasSubstr("gemm_tflops must be > 0"));
  job = *MakePipelineJob(shape, {});
  job.backward_attention = -1;
  EXPECT_THAT(std::string(StepTimeModel::Create(job).status().message()),
              HasSubstr("backward_attention"));
  const StepTimeModel model = *StepTimeModel::Create(*MakePipelineJob(shape, {}));
  EXPECT_THAT(
      std::string(model.MicroBatchTimes(Batch({10}), {.candidates = {}}).status().message()),
      HasSubstr("no candidate"));
  StepPlan odd;
  odd.micro_batches = {Batch({10}), Batch({20}), Batch({30})};
  const StepTimeModel dp2 =
      *StepTimeModel::Create(*MakePipelineJob(shape, {.tp = 1, .cp = 1, .pp = 1, .dp = 2}));
  EXPECT_THAT(std::string(dp2.StepSeconds(odd, {}).status().message()), HasSubstr("DP = 2"));
}

}  // namespace step_time_test
}  // namespace wlb
