// ReceiveObserver: a layer's hook into the receiving of a streamed message
// (a payload that arrives in pieces, rpc/grpc/stream.h), so the layer can
// act on the payload's bytes while the rest is still arriving. The device
// layer copies tensors to their device as their bytes come in (pipelined
// landing, docs/design/cuda_rpc.md). Layer-neutral: rpc/ hands over the
// layer's own header bytes and byte counts, never a device.
//
// Contract: the receiver calls Observe once per streamed message that
// carries the observer's layer header, after the sender was admitted and the
// declared length checked, before the payload buffer exists. Null: receive
// as usual. Otherwise the buffer comes from progress->allocator() (null: the
// receiver's own), Started(buffer) is called once, then Received(n) after
// each piece, n being the payload bytes in place so far (increasing; the
// last call has n == the total). A stream that fails drops the progress; a
// complete one hands it over with the payload, so it is destroyed when the
// last tensor decoded from that payload goes. Either way its destructor must
// release what it took and wait for nothing it cannot bound.
//
// Thread safety: Observe may run on several threads at once. One progress's
// calls come from one thread at a time, in order (a reactor's callbacks);
// other methods the layer adds may run concurrently with them. The
// destructor may run on any thread.
#ifndef FERRY_RPC_RECEIVE_OBSERVER_H_
#define FERRY_RPC_RECEIVE_OBSERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/tensor/storage.h"

namespace ferry::rpc {

/// What the receiver knows of a streamed message when its payload begins.
struct ReceiveStart {
  bool request = true;         ///< A request (else a reply).
  std::string_view peer;       ///< The sending worker's name.
  const std::string* header = nullptr;  ///< The observer's layer header.
  uint64_t payload_bytes = 0;  ///< The declared payload length.
};

/// One observed message's receiving (see the top of the file).
class ReceiveProgress {
 public:
  virtual ~ReceiveProgress() = default;
  /// Where the payload buffer comes from; null: the receiver's own.
  virtual Allocator* allocator() = 0;
  /// Once, with the payload buffer, before any byte is in it.
  virtual void Started(const Storage& buffer) = 0;
  /// After each piece: payload bytes [0, received) are in the buffer.
  virtual void Received(uint64_t received) = 0;
};

/// A layer's observer of streamed messages (see the top of the file).
class ReceiveObserver {
 public:
  virtual ~ReceiveObserver() = default;
  /// The layer-header id whose messages it observes (rpc/layer.h).
  virtual uint32_t layer() const = 0;
  /// The progress of the message `start` describes; null: not observed.
  virtual std::shared_ptr<ReceiveProgress> Observe(
      const ReceiveStart& start) = 0;
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_RECEIVE_OBSERVER_H_
