// Command noopplugin is the Go floor of the device-plugin benchmarks: a device plugin that does nothing beyond
// the protocol. It serves the v1beta1 DevicePlugin service on -socket, registers -resource with the kubelet at
// -kubelet, lists -devices healthy devices once, answers Allocate with empty container responses and
// GetPreferredAllocation with the first available IDs. Any cost a real plugin shows above this one is its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type server struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
}

func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (s *server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (s *server) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		n := int(c.AllocationSize)
		if n > len(c.AvailableDeviceIDs) {
			n = len(c.AvailableDeviceIDs)
		}
		out.ContainerResponses = append(out.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: c.AvailableDeviceIDs[:n]})
	}
	return out, nil
}

func (s *server) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for range r.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return out, nil
}

func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	socket := flag.String("socket", "", "path of this plugin's unix socket")
	kubelet := flag.String("kubelet", pluginapi.KubeletSocket, "the kubelet's registration socket")
	resource := flag.String("resource", "example.com/noop", "extended resource name")
	count := flag.Int("devices", 16, "number of healthy devices to list")
	flag.Parse()
	if *socket == "" {
		fmt.Fprintln(os.Stderr, "noopplugin: -socket is required")
		os.Exit(2)
	}
	s := &server{}
	for i := 0; i < *count; i++ {
		s.devices = append(s.devices, &pluginapi.Device{ID: fmt.Sprintf("dev-%d", i), Health: pluginapi.Healthy})
	}
	_ = os.Remove(*socket)
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "noopplugin:", err)
		os.Exit(1)
	}
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, s)
	go func() { _ = g.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+*kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		_, err = pluginapi.NewRegistrationClient(conn).Register(context.Background(), &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: filepath.Base(*socket), ResourceName: *resource,
			Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
		})
		_ = conn.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "noopplugin: register:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	g.Stop()
}
