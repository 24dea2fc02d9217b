package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// plugin serves the device plugin v1beta1 API for one resource.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	inv      *inventory
	stop     chan struct{} // closed when the process shuts down: ends every ListAndWatch
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the whole list at once and again after every change.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices, changed := p.inv.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			p.inv.forget(changed)
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			p.inv.forget(changed)
			return nil
		case <-p.stop:
			p.inv.forget(changed)
			return nil
		}
	}
}

func (p *plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for _, req := range r.ContainerRequests {
		ids := p.inv.preferred(req.AvailableDeviceIDs, req.MustIncludeDeviceIDs, int(req.AllocationSize))
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return out, nil
}

// Allocate hands each container an environment variable naming its devices, as a real plugin
// hands device nodes and variables.
func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, req := range r.ContainerRequests {
		for _, id := range req.DevicesIds {
			if !p.inv.has(id) {
				return nil, fmt.Errorf("allocate: no device %q", id)
			}
		}
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{envName(p.resource): strings.Join(req.DevicesIds, ",")},
		})
	}
	return out, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func envName(resource string) string {
	return strings.ToUpper(strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(resource)) + "_DEVICES"
}

// listen serves the plugin on a fresh socket at path (removing what is there: the kubelet may
// have deleted it, or a previous process left it).
func listen(path string, p *plugin) (*grpc.Server, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(l) }()
	return server, nil
}

// register tells the kubelet at kubeletSocket about the plugin's socket (its base name, in the
// same directory) and resource.
func register(ctx context.Context, kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}
