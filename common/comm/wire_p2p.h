// wire_p2p.h: point-to-point messages in a low-precision format, a pipeline's activations and their
// gradients between stages, the counterpart of wire_format.h's collectives. Defined beside them
// (wire_format.cpp), whose staging buffer and rule they share: a sent message's values are rounded
// once to the format (times the wire's scale) before the send, a received one's codes decoded into
// the caller's fp32 tensor when the handle is waited. A Wire of fp32 calls the communicator as it
// is. Defines wire_send_async, wire_recv_async and wire_send_recv_async.
#pragma once
#include <vector>

#include "comm/comm.h"
#include "comm/wire_format.h"  // Wire

// 16-bit formats only (bf16, fp16): the layer's dtype, which a pipeline's messages take.
CommHandle wire_send_async(Communicator& comm, Tensor buf, int peer, int tag, const Wire& wire);
CommHandle wire_recv_async(Communicator& comm, Tensor buf, int peer, int tag, const Wire& wire);
// One group call (Communicator::send_recv_async) of ops[i] each in wires[i]; its handle decodes every
// receive once waited.
CommHandle wire_send_recv_async(Communicator& comm, const std::vector<Communicator::PointToPoint>& ops,
                                const std::vector<Wire>& wires);
