#include "ferry/rpc/message.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "ferry/rpc/context.h"

namespace ferry::rpc {
namespace {

TEST(Message, TensorsAreReachableWithoutEncoding) {
  Tensor a = full({2}, 1.0);
  Tensor b = full({3}, 2.0);
  Value::Dict d;
  d["b"] = Value::FromTensor(b);
  d["n"] = Value::Int(4);
  Message m;
  m.payload = Value::FromList({Value::FromTensor(a), Value::FromDict(d)});
  std::vector<Tensor> ts = m.Tensors();
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].data<float>(), a.data<float>());  // Same storage, not a copy.
  EXPECT_EQ(ts[1].data<float>(), b.data<float>());
  int seen = 0;
  ForEachTensor(m.payload, [&](Tensor& t) {
    ++seen;
    t = full({1}, 9.0);
  });
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(m.Tensors()[1].to_vector<float>(), std::vector<float>{9});
}

TEST(Message, NamesTypesAndTargets) {
  EXPECT_EQ(MessageTypeName(MessageType::kPing), "PING");
  EXPECT_EQ(MessageTypeName(static_cast<MessageType>(1003)), "TYPE_1003");
  Message call;
  call.type = MessageType::kCall;
  call.function = "add";
  EXPECT_EQ(DescribeTarget("b", call), "worker 'b' function 'add'");
  Message ping;
  ping.type = MessageType::kPing;
  EXPECT_EQ(DescribeTarget("b", ping), "worker 'b' message PING");
}

TEST(Context, ScopesNestAndStayOnTheirThread) {
  EXPECT_TRUE(CurrentContext().empty());
  {
    ScopedContextEntry outer("k", "1");
    {
      ScopedContextEntry inner("k", "2");
      EXPECT_EQ(CurrentContextValue("k"), "2");
      std::thread([] {
        EXPECT_FALSE(CurrentContextValue("k").has_value());
      }).join();
    }
    EXPECT_EQ(CurrentContextValue("k"), "1");
    {
      ScopedContext replaced(ContextEntries{{"x", "y"}});
      EXPECT_FALSE(CurrentContextValue("k").has_value());
      EXPECT_EQ(CurrentContextValue("x"), "y");
    }
    EXPECT_EQ(CurrentContextValue("k"), "1");
  }
  EXPECT_TRUE(CurrentContext().empty());
}

}  // namespace
}  // namespace ferry::rpc
