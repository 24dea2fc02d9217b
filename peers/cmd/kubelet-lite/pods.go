package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podSpec is a pod as the control interface and the pods file carry it: what the device
// manager and the pod-resources server read of a v1.Pod.
type podSpec struct {
	Namespace  string          `json:"namespace"`
	Name       string          `json:"name"`
	UID        string          `json:"uid"`
	Containers []containerSpec `json:"containers"`
}

type containerSpec struct {
	Name string `json:"name"`
	// Resources: extended resource name -> count. The device manager reads limits (extended
	// resources cannot be overcommitted, so requests equal limits); both are set.
	Resources map[string]int64 `json:"resources,omitempty"`
}

func (p podSpec) validate() error {
	if p.Namespace == "" || p.Name == "" || p.UID == "" {
		return errors.New("a pod needs namespace, name and uid")
	}
	if len(p.Containers) == 0 {
		return errors.New("a pod needs at least one container")
	}
	return nil
}

func (p podSpec) toPod() *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: types.UID(p.UID)},
	}
	for _, c := range p.Containers {
		list := v1.ResourceList{}
		for name, count := range c.Resources {
			list[v1.ResourceName(name)] = *resource.NewQuantity(count, resource.DecimalSI)
		}
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{
			Name:      c.Name,
			Resources: v1.ResourceRequirements{Limits: list, Requests: list.DeepCopy()},
		})
	}
	return pod
}

// podsFile is kubelet-lite's pod source: the admitted pods, rewritten (temp file + rename) on
// every admission and removal and read back on start. A kubelet gets its pods again from the API
// server and static manifests after a restart; without this file a restarted kubelet-lite would
// list no pods while its checkpoint still held their devices.
type podsFile struct{ path string }

func (f podsFile) load() ([]podSpec, error) {
	data, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pods []podSpec
	if err := json.Unmarshal(data, &pods); err != nil {
		return nil, fmt.Errorf("pods file %s: %w", f.path, err)
	}
	return pods, nil
}

func (f podsFile) save(pods []podSpec) error {
	data, err := json.MarshalIndent(pods, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".pods-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}
