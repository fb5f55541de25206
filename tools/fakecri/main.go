// Command fakecri is a container runtime for tests: it answers the kubelet's CRI calls with the in-memory
// fake from k8s.io/cri-client/pkg/fake (nothing is run) and appends every request that says what a container
// would get (sandbox, container, image pull, start/stop/remove) to a JSON-lines file, one object per call:
//
//	{"time":"2026-12-02T10:00:00.123Z","method":"CreateContainer","request":{...CRI request as protojson...}}
//
// Tests read that file to check the devices, mounts, environment and CDI device names the kubelet passed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// recorder appends one JSON line per recorded call.
type recorder struct {
	mu   sync.Mutex
	file *os.File
}

func (r *recorder) record(method string, req proto.Message) {
	body, err := protojson.Marshal(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: cannot encode %s request: %v\n", method, err)
		return
	}
	line, err := json.Marshal(struct {
		Time    string          `json:"time"`
		Method  string          `json:"method"`
		Request json.RawMessage `json:"request"`
	}{time.Now().UTC().Format(time.RFC3339Nano), method, body})
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: cannot encode %s record: %v\n", method, err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.file.Write(append(line, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: cannot write record: %v\n", err)
	}
}

// runtime is the cri-client fake with recording wrappers around the calls tests look at.
type runtime struct {
	*fake.RemoteRuntime
	rec *recorder
}

func (f *runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	f.rec.record("RunPodSandbox", req)
	return f.RemoteRuntime.RunPodSandbox(ctx, req)
}

func (f *runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.rec.record("StopPodSandbox", req)
	return f.RemoteRuntime.StopPodSandbox(ctx, req)
}

func (f *runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.rec.record("RemovePodSandbox", req)
	return f.RemoteRuntime.RemovePodSandbox(ctx, req)
}

func (f *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.rec.record("CreateContainer", req)
	resp, err := f.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return resp, err
	}
	// Report the log path a real runtime would (the sandbox's log directory plus the container's log path). The
	// cri-api fake leaves it empty, and the kubelet's container GC then removes the directory of "" : its cwd.
	logPath := filepath.Join(req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath())
	if filepath.IsAbs(logPath) {
		f.RuntimeService.Lock()
		if c, ok := f.RuntimeService.Containers[resp.ContainerId]; ok {
			c.LogPath = logPath
		}
		f.RuntimeService.Unlock()
	}
	return resp, nil
}

func (f *runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	f.rec.record("StartContainer", req)
	return f.RemoteRuntime.StartContainer(ctx, req)
}

func (f *runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	f.rec.record("StopContainer", req)
	return f.RemoteRuntime.StopContainer(ctx, req)
}

func (f *runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	f.rec.record("RemoveContainer", req)
	return f.RemoteRuntime.RemoveContainer(ctx, req)
}

func (f *runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	f.rec.record("PullImage", req)
	return f.RemoteRuntime.PullImage(ctx, req)
}

// forgetCalls empties the fake's call log now and then: it only grows, and nothing here reads it.
func (f *runtime) forgetCalls(every time.Duration) {
	for range time.Tick(every) {
		f.RuntimeService.Lock()
		f.RuntimeService.Called = nil
		f.RuntimeService.Unlock()
		f.ImageService.Lock()
		f.ImageService.Called = nil
		f.ImageService.Unlock()
	}
}

func main() {
	listen := flag.String("listen", "", "unix socket path to serve the CRI on (required)")
	recordPath := flag.String("record", "", "JSON-lines file that gets one line per recorded call (required)")
	imageSize := flag.Uint64("image-size", 64<<20, "size in bytes reported for every image (the kubelet rejects 0)")
	flag.Parse()
	if *listen == "" || *recordPath == "" {
		fmt.Fprintln(os.Stderr, "usage: fakecri --listen SOCKET --record FILE [--image-size BYTES]")
		os.Exit(2)
	}
	file, err := os.OpenFile(*recordPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: cannot open record file: %v\n", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(filepath.Dir(*listen), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}
	if err := os.Remove(*listen); err != nil && !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "fakecri: cannot remove stale socket: %v\n", err)
		os.Exit(1)
	}
	lis, err := net.Listen("unix", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: cannot listen on %s: %v\n", *listen, err)
		os.Exit(1)
	}

	rt := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), rec: &recorder{file: file}}
	rt.ImageService.SetFakeImageSize(*imageSize)
	rt.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	// The kubelet takes its cgroup driver from the runtime; cgroupfs is what it is configured with here.
	rt.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	go rt.forgetCalls(time.Minute)

	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, rt)
	runtimeapi.RegisterImageServiceServer(server, rt)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fakecri: serving on %s, recording to %s\n", *listen, *recordPath)
	if err := server.Serve(lis); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}
	_ = os.Remove(*listen)
}
