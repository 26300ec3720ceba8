// watchdog.h: the watchdog for the host's blocking waits on a GPU. A stuck collective on MPI is
// caught by the communicator's own watchdog (comm.h, set_comm_timeout), which sees every op it
// posts. On a GPU the host never sees NCCL's ops wait: it blocks in one CUDA call (a device or
// stream synchronize) until the GPU is done, and a peer that stopped leaves that call waiting
// forever. Each such call is wrapped in a BlockedOnDevice; a background thread, started by the
// first one, ends the job when a wait outlasts the timeout, naming what waited and the step (like
// PyTorch's NCCL watchdog), and the rank that is stopped or gone where this node can see one.
// Defines set_device_wait_timeout(), BlockedOnDevice and device_wait_message().
#pragma once
#include <string>

// 0 switches it off (the default). Process-wide; the run sets it from --timeout.
void set_device_wait_timeout(double seconds);

// While one lives, the host is blocked on the device, in `what` ("waiting for the GPU to finish
// the step's work"). One at a time: the calls they wrap do not nest.
class BlockedOnDevice {
 public:
  explicit BlockedOnDevice(const char* what);
  ~BlockedOnDevice();
  BlockedOnDevice(const BlockedOnDevice&) = delete;
  BlockedOnDevice& operator=(const BlockedOnDevice&) = delete;
};

// The watchdog's message for `what` ("waiting for the GPU to finish its work") in `phase` (the step;
// "" for none) after `waited_s`: names the ranks on this node that are stopped or have ended
// (peer_state.h), else "a peer rank".
std::string device_wait_message(const std::string& what, const std::string& phase, double waited_s);
