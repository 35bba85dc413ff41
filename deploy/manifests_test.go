// Package deploy_test checks the Kubernetes examples: every manifest decodes strictly into the
// Kubernetes API type of its kind, and the set-up steps in docs/operations.md create every
// Namespace, ConfigMap, Secret and key that the manifests (and the broker config they carry)
// refer to, so that the examples start as written on a plain cluster.
package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/capbroker/capbroker/broker/config"
)

const manifestsDir = "kubernetes"

// object is one decoded manifest document.
type object struct {
	file string
	kind string
	name string
	ns   string // "" for cluster-scoped kinds and when the file does not say
	obj  any
}

var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":      {"v1", func() any { return new(corev1.Namespace) }},
	"ServiceAccount": {"v1", func() any { return new(corev1.ServiceAccount) }},
	"ConfigMap":      {"v1", func() any { return new(corev1.ConfigMap) }},
	"Secret":         {"v1", func() any { return new(corev1.Secret) }},
	"Service":        {"v1", func() any { return new(corev1.Service) }},
	"Pod":            {"v1", func() any { return new(corev1.Pod) }},
	"Deployment":     {"apps/v1", func() any { return new(appsv1.Deployment) }},
	"StatefulSet":    {"apps/v1", func() any { return new(appsv1.StatefulSet) }},
	"NetworkPolicy":  {"networking.k8s.io/v1", func() any { return new(networkingv1.NetworkPolicy) }},
	// deploy/kubernetes/fleet
	"HorizontalPodAutoscaler": {"autoscaling/v2", func() any { return new(autoscalingv2.HorizontalPodAutoscaler) }},
	"PodDisruptionBudget":     {"policy/v1", func() any { return new(policyv1.PodDisruptionBudget) }},
}

// decodeFile decodes every document of a manifest file strictly (unknown fields are errors).
func decodeFile(t *testing.T, file string) []object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct{ Name, Namespace string }
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		k, ok := kinds[meta.Kind]
		if !ok {
			t.Fatalf("%s document %d: kind %q is not one this test knows; add its API type", file, i, meta.Kind)
		}
		if meta.APIVersion != k.apiVersion {
			t.Errorf("%s: %s %s: apiVersion %q, want %q", file, meta.Kind, meta.Metadata.Name, meta.APIVersion, k.apiVersion)
		}
		obj := k.new()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s: %s %s: %v", file, meta.Kind, meta.Metadata.Name, err)
			continue
		}
		if meta.Metadata.Name == "" {
			t.Errorf("%s document %d: no metadata.name", file, i)
		}
		out = append(out, object{file: file, kind: meta.Kind, name: meta.Metadata.Name, ns: meta.Metadata.Namespace, obj: obj})
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

// kustomize is `kubectl apply -k dir` as far as these examples use it: the resources, in the
// kustomization's namespace.
func kustomize(t *testing.T, dir string) []object {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" || k.Namespace == "" {
		t.Fatalf("%s/kustomization.yaml: %+v", dir, k)
	}
	var out []object
	for _, r := range k.Resources {
		for _, o := range decodeFile(t, filepath.Join(dir, r)) {
			if o.kind != "Namespace" {
				if o.ns != "" && o.ns != k.Namespace {
					t.Errorf("%s: %s %s in namespace %s, the kustomization sets %s", o.file, o.kind, o.name, o.ns, k.Namespace)
				}
				o.ns = k.Namespace
			}
			out = append(out, o)
		}
	}
	return out
}

// manifestDirs are the folders holding a kustomization.
func manifestDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(manifestsDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(p))
		}
		return err
	})
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no kustomization under %s: %v", manifestsDir, err)
	}
	sort.Strings(dirs)
	return dirs
}

// TestManifestsDecodeAsAPITypes: every manifest is a valid object of its kind, every file is
// part of a kustomization, and each workload mounts only volumes it declares.
func TestManifestsDecodeAsAPITypes(t *testing.T) {
	listed := map[string]bool{}
	for _, dir := range manifestDirs(t) {
		for _, o := range kustomize(t, dir) {
			listed[o.file] = true
			checkWorkload(t, o)
		}
	}
	_ = filepath.WalkDir(manifestsDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".yaml" && d.Name() != "kustomization.yaml" && !listed[p] {
			t.Errorf("%s is in no kustomization's resources", p)
		}
		return nil
	})
}

// podSpec returns the pod spec of a workload, nil for other kinds.
func podSpec(o object) *corev1.PodSpec {
	switch v := o.obj.(type) {
	case *corev1.Pod:
		return &v.Spec
	case *appsv1.Deployment:
		return &v.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &v.Spec.Template.Spec
	}
	return nil
}

// replicas is how many pods a workload runs (a Pod: one; no replicas field: one).
func replicas(o object) int32 {
	var r *int32
	switch v := o.obj.(type) {
	case *appsv1.Deployment:
		r = v.Spec.Replicas
	case *appsv1.StatefulSet:
		r = v.Spec.Replicas
	}
	if r == nil {
		return 1
	}
	return *r
}

// claimTemplates are the volumes a StatefulSet's pods get from its volumeClaimTemplates.
func claimTemplates(o object) map[string]bool {
	out := map[string]bool{}
	if s, ok := o.obj.(*appsv1.StatefulSet); ok {
		for _, c := range s.Spec.VolumeClaimTemplates {
			out[c.Name] = true
		}
	}
	return out
}

func checkWorkload(t *testing.T, o object) {
	t.Helper()
	var selector *metav1.LabelSelector
	var template map[string]string
	switch d := o.obj.(type) {
	case *appsv1.Deployment:
		selector, template = d.Spec.Selector, d.Spec.Template.Labels
	case *appsv1.StatefulSet:
		selector, template = d.Spec.Selector, d.Spec.Template.Labels
	}
	if _, ok := o.obj.(*corev1.Pod); !ok && podSpec(o) != nil {
		if selector == nil {
			t.Errorf("%s: %s %s has no selector", o.file, o.kind, o.name)
		} else {
			for k, v := range selector.MatchLabels {
				if template[k] != v {
					t.Errorf("%s: %s %s: selector %s=%s does not match its pod template", o.file, o.kind, o.name, k, v)
				}
			}
		}
	}
	spec := podSpec(o)
	if spec == nil {
		return
	}
	volumes := claimTemplates(o)
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	used := map[string]bool{}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, m := range c.VolumeMounts {
			used[m.Name] = true
			if !volumes[m.Name] {
				t.Errorf("%s: %s/%s mounts volume %q, which the pod does not declare", o.file, o.name, c.Name, m.Name)
			}
		}
		if c.Image == "" {
			t.Errorf("%s: %s/%s has no image", o.file, o.name, c.Name)
		}
	}
	for v := range volumes {
		if !used[v] {
			t.Errorf("%s: %s: volume %q is mounted by no container", o.file, o.name, v)
		}
	}
}

// cluster is what the set-up steps and the manifests create: namespaces, and the keys of every
// ConfigMap and Secret by namespace/kind/name.
type cluster struct {
	namespaces map[string]bool
	keys       map[string]map[string]bool // "ns/Kind/name" -> keys
	workloads  []object
}

func (c *cluster) add(t *testing.T, step string, o object) {
	t.Helper()
	switch o.kind {
	case "Namespace":
		c.namespaces[o.name] = true
		return
	case "ConfigMap", "Secret":
		keys := map[string]bool{}
		switch v := o.obj.(type) {
		case *corev1.ConfigMap:
			for k := range v.Data {
				keys[k] = true
			}
		case *corev1.Secret:
			for k := range v.StringData {
				keys[k] = true
			}
			for k := range v.Data {
				keys[k] = true
			}
		}
		c.create(t, step, o.ns, o.kind, o.name, keys)
		return
	}
	if !c.namespaces[o.ns] {
		t.Errorf("%s: %s %s in namespace %q, which no step has created", step, o.kind, o.name, o.ns)
	}
	if podSpec(o) != nil {
		c.workloads = append(c.workloads, o)
	}
}

func (c *cluster) create(t *testing.T, step, ns, kind, name string, keys map[string]bool) {
	t.Helper()
	if !c.namespaces[ns] {
		t.Errorf("%s: namespace %q does not exist yet", step, ns)
	}
	id := ns + "/" + kind + "/" + name
	if c.keys[id] != nil {
		t.Errorf("%s: %s exists already", step, id)
	}
	c.keys[id] = keys
}

// setupBlocks returns the shell blocks of docs/operations.md marked "# set-up: DIR", by DIR.
func setupBlocks(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	var dir string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.HasPrefix(line, "```sh"):
			in, dir = true, ""
		case in && line == "```":
			in = false
		case in && strings.HasPrefix(line, "# set-up: "):
			dir = strings.TrimPrefix(line, "# set-up: ")
		case in && dir != "":
			blocks[dir] = append(blocks[dir], line)
		}
	}
	return blocks
}

var fromFile = regexp.MustCompile(`--from-file=(\S+)`)

// TestSetupStepsCreateWhatManifestsUse walks through each documented set-up: every command
// that creates something is applied to a model of the cluster, then every workload's
// ConfigMaps, Secrets and keys, and every file its broker config names, must be there.
func TestSetupStepsCreateWhatManifestsUse(t *testing.T) {
	blocks := setupBlocks(t)
	for _, dir := range manifestDirs(t) {
		rel := path.Join("deploy", filepath.ToSlash(dir))
		steps, ok := blocks[rel]
		if !ok {
			t.Errorf("docs/operations.md has no set-up block for %s (a ```sh block starting \"# set-up: %s\")", rel, rel)
			continue
		}
		t.Run(rel, func(t *testing.T) {
			c := &cluster{namespaces: map[string]bool{}, keys: map[string]map[string]bool{}}
			applied := false
			for _, step := range steps {
				cmd, _, _ := strings.Cut(step, " #")
				f := strings.Fields(cmd)
				if len(f) == 0 || f[0] != "kubectl" {
					continue
				}
				ns := ""
				if len(f) > 2 && f[1] == "-n" {
					ns, f = f[2], append(f[:1:1], f[3:]...)
				}
				switch {
				case len(f) == 4 && f[1] == "apply" && f[2] == "-f":
					for _, o := range decodeFile(t, strings.TrimPrefix(f[3], "deploy/")) {
						c.add(t, step, o)
					}
				case len(f) == 4 && f[1] == "apply" && f[2] == "-k":
					if strings.TrimSuffix(f[3], "/") != rel {
						t.Errorf("%s: applies %s in the set-up of %s", step, f[3], rel)
					}
					for _, o := range kustomize(t, dir) {
						c.add(t, step, o)
					}
					applied = true
				case len(f) >= 5 && f[1] == "create" && (f[2] == "secret" && f[3] == "generic" || f[2] == "configmap"):
					kind, name := "ConfigMap", f[3]
					if f[2] == "secret" {
						kind, name = "Secret", f[4]
					}
					keys := map[string]bool{}
					for _, m := range fromFile.FindAllStringSubmatch(cmd, -1) {
						key, file, ok := strings.Cut(m[1], "=")
						if !ok {
							key = path.Base(file)
						}
						keys[key] = true
					}
					if len(keys) == 0 {
						t.Errorf("%s: no --from-file", step)
					}
					c.create(t, step, ns, kind, name, keys)
				default:
					t.Errorf("%s: a kubectl command this walk-through does not know", step)
				}
			}
			if !applied {
				t.Fatalf("the set-up of %s never runs kubectl apply -k", rel)
			}
			for _, w := range c.workloads {
				checkReferences(t, c, w)
			}
		})
	}
}

// checkReferences: every ConfigMap, Secret and key a workload uses exists, and every file the
// broker's config names is on a volume that holds it.
func checkReferences(t *testing.T, c *cluster, w object) {
	t.Helper()
	spec := podSpec(w)
	need := func(kind, name, key, why string) {
		keys, ok := c.keys[w.ns+"/"+kind+"/"+name]
		switch {
		case !ok:
			t.Errorf("%s %s: %s: %s %s/%s is created by no step", w.kind, w.name, why, kind, w.ns, name)
		case key != "" && !keys[key]:
			t.Errorf("%s %s: %s: %s %s has no key %q (has %v)", w.kind, w.name, why, kind, name, key, keys)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			need("ConfigMap", v.ConfigMap.Name, "", "volume "+v.Name)
			for _, it := range v.ConfigMap.Items {
				need("ConfigMap", v.ConfigMap.Name, it.Key, "volume "+v.Name)
			}
		case v.Secret != nil:
			need("Secret", v.Secret.SecretName, "", "volume "+v.Name)
			for _, it := range v.Secret.Items {
				need("Secret", v.Secret.SecretName, it.Key, "volume "+v.Name)
			}
		}
	}
	for _, ctr := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, e := range ctr.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				need("Secret", e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key, "env "+e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				need("ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key, "env "+e.Name)
			}
		}
		cfgPath := ""
		for i, a := range ctr.Args {
			if a == "--config" && i+1 < len(ctr.Args) {
				cfgPath = ctr.Args[i+1]
			}
		}
		if cfgPath == "" {
			continue
		}
		// The broker: its config is a key of a ConfigMap volume.
		where := func(file string) (corev1.Volume, corev1.VolumeMount, bool) { return mountFor(ctr, volumes, file) }
		v, m, ok := where(cfgPath)
		if !ok || v.ConfigMap == nil || m.SubPath != "" {
			t.Errorf("%s %s/%s: --config %s is not a key of a ConfigMap volume mounted as a directory (without subPath)", w.kind, w.name, ctr.Name, cfgPath)
			continue
		}
		raw := configMapData(t, c, w.ns, v.ConfigMap.Name, strings.TrimPrefix(cfgPath, m.MountPath+"/"))
		cfg, err := config.Parse([]byte(raw))
		if err != nil {
			t.Errorf("%s %s: %s: %v", w.kind, w.name, cfgPath, err)
			continue
		}
		cfg.SetDefaults()
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Errorf("%s %s: %s does not validate: %v", w.kind, w.name, cfgPath, errs)
		}
		for key, file := range configFiles(cfg) {
			if file == "" || (key == "policy.dir" && file == "/etc/broker/policies") { // in the image (Dockerfile)
				continue
			}
			v, m, ok := where(file)
			switch {
			case !ok:
				t.Errorf("%s %s/%s: %s %s is on no volume the container mounts", w.kind, w.name, ctr.Name, key, file)
			case v.ConfigMap != nil && m.SubPath == "" && file == m.MountPath:
				need("ConfigMap", v.ConfigMap.Name, "", key) // a directory: policy.dir as a ConfigMap
			case v.ConfigMap != nil && m.SubPath == "":
				need("ConfigMap", v.ConfigMap.Name, strings.TrimPrefix(file, m.MountPath+"/"), key)
			case v.Secret != nil && m.SubPath == "":
				need("Secret", v.Secret.SecretName, strings.TrimPrefix(file, m.MountPath+"/"), key)
			case v.EmptyDir != nil:
				// Written by an init container that mounts the same volume.
				if !slices.ContainsFunc(spec.InitContainers, func(ic corev1.Container) bool {
					return slices.ContainsFunc(ic.VolumeMounts, func(im corev1.VolumeMount) bool { return im.Name == v.Name })
				}) {
					t.Errorf("%s %s: %s %s: emptyDir %s is filled by no init container", w.kind, w.name, key, file, v.Name)
				}
			default:
				t.Errorf("%s %s: %s %s: volume %s is of a kind this walk-through does not check", w.kind, w.name, key, file, v.Name)
			}
		}
	}
}

// configMapData is the text under a key of a ConfigMap in the manifests (not one made by a
// step: those hold files the user brings).
func configMapData(t *testing.T, c *cluster, ns, name, key string) string {
	t.Helper()
	for _, dir := range manifestDirs(t) {
		for _, o := range kustomize(t, dir) {
			if cm, ok := o.obj.(*corev1.ConfigMap); ok && o.ns == ns && o.name == name {
				return cm.Data[key]
			}
		}
	}
	t.Fatalf("ConfigMap %s/%s is not in the manifests", ns, name)
	return ""
}

// configFiles lists every file a broker config names, by key path.
func configFiles(cfg *config.Config) map[string]string {
	files := map[string]string{
		"ca.cert_file":     cfg.CA.CertFile,
		"ca.key_file":      cfg.CA.KeyFile,
		"upstream.ca_file": cfg.Upstream.CAFile,
		"policy.dir":       cfg.Policy.Dir,
		"audit.file":       cfg.Audit.File,
	}
	if v := cfg.Vault; v != nil {
		files["vault.ca_file"] = v.CAFile
		files["vault.auth.token_file"] = v.Auth.TokenFile
		files["vault.auth.role_id_file"] = v.Auth.RoleIDFile
		files["vault.auth.secret_id_file"] = v.Auth.SecretIDFile
	}
	for i, a := range cfg.Agents {
		files[fmt.Sprintf("agents[%d].token_file", i)] = a.TokenFile
	}
	for i, c := range cfg.Credentials {
		files[fmt.Sprintf("credentials[%d].source.file", i)] = c.Source.File
	}
	return files
}

// mountFor is the container's mount holding file (the longest mount path above it) and its volume.
func mountFor(ctr corev1.Container, volumes map[string]corev1.Volume, file string) (corev1.Volume, corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	for _, m := range ctr.VolumeMounts {
		if (file == m.MountPath || strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	v, ok := volumes[best.Name]
	return v, best, ok && best.Name != ""
}

// templateLabels are the labels of a workload's pods.
func templateLabels(o object) map[string]string {
	switch v := o.obj.(type) {
	case *corev1.Pod:
		return v.Labels
	case *appsv1.Deployment:
		return v.Spec.Template.Labels
	case *appsv1.StatefulSet:
		return v.Spec.Template.Labels
	}
	return nil
}

// TestBrokerManifestsInvariants checks, for every broker container of every kustomization,
// what running it takes beyond valid objects:
//   - no subPath mount: the kubelet never updates a file mounted with subPath, so a ConfigMap
//     update would never reach the broker (and a rotated Secret never either);
//   - approvals.state_file (default: beside the config) is on a writable volume (an emptyDir
//     or a PersistentVolumeClaim, not read-only): a ConfigMap volume is read-only;
//   - more than one replica keeps budgets and approval grants in Redis
//     (budgets.store.redis), with a Service of that name in the manifests selecting pods, and
//     the password variable set: otherwise each pod counts its own budgets and keeps its own grants.
func TestBrokerManifestsInvariants(t *testing.T) {
	brokers := 0
	for _, dir := range manifestDirs(t) {
		objs := kustomize(t, dir)
		for _, w := range objs {
			spec := podSpec(w)
			if spec == nil {
				continue
			}
			volumes := map[string]corev1.Volume{}
			for _, v := range spec.Volumes {
				volumes[v.Name] = v
			}
			claims := claimTemplates(w)
			for _, ctr := range spec.Containers {
				i := slices.Index(ctr.Args, "--config")
				if len(ctr.Args) == 0 || ctr.Args[0] != "run" || i < 0 || i+1 >= len(ctr.Args) {
					continue
				}
				brokers++
				where := fmt.Sprintf("%s: %s %s/%s", w.file, w.kind, w.name, ctr.Name)
				cfgPath := ctr.Args[i+1]
				for _, m := range ctr.VolumeMounts {
					if m.SubPath != "" || m.SubPathExpr != "" {
						t.Errorf("%s: volume %s is mounted with subPath at %s: the kubelet never updates it, so a change of its ConfigMap or Secret never reaches the broker; mount the directory", where, m.Name, m.MountPath)
					}
				}
				v, m, ok := mountFor(ctr, volumes, cfgPath)
				if !ok || v.ConfigMap == nil {
					t.Errorf("%s: --config %s is not on a ConfigMap volume", where, cfgPath)
					continue
				}
				var raw string
				for _, o := range objs {
					if cm, isCM := o.obj.(*corev1.ConfigMap); isCM && o.name == v.ConfigMap.Name {
						raw = cm.Data[strings.TrimPrefix(cfgPath, m.MountPath+"/")]
					}
				}
				cfg, err := config.Parse([]byte(raw))
				if err != nil {
					t.Errorf("%s: --config %s: %v", where, cfgPath, err)
					continue
				}
				state := cfg.Approvals.StateFile
				if state == "" {
					state = path.Join(path.Dir(cfgPath), "capbroker-approvals.json")
				}
				sv, sm, ok := mountFor(ctr, volumes, state)
				writable := ok && !sm.ReadOnly && (sv.EmptyDir != nil || sv.PersistentVolumeClaim != nil || claims[sm.Name])
				if !writable {
					t.Errorf("%s: approvals.state_file %s is not on a writable volume (an emptyDir or a PersistentVolumeClaim mounted read-write): the broker refuses to start", where, state)
				}
				if n := replicas(w); n > 1 {
					r := cfg.Budgets.Store.Redis
					if r == nil {
						t.Errorf("%s: %d replicas without budgets.store.redis: each pod would count its own budgets and keep its own approval grants", where, n)
						continue
					}
					host, port, _ := strings.Cut(r.Address, ":")
					var redisPods []map[string]string
					for _, o := range objs {
						if svc, isSvc := o.obj.(*corev1.Service); isSvc && o.name == host {
							for _, p := range objs {
								if labels := templateLabels(p); p.name != w.name && selects(svc.Spec.Selector, labels) {
									redisPods = append(redisPods, labels)
								}
							}
						}
					}
					if len(redisPods) == 0 {
						t.Errorf("%s: budgets.store.redis.address %s is no Service of the manifests selecting a workload: ship Redis with more than one replica", where, r.Address)
					}
					// With NetworkPolicies in the namespace, the brokers must be let through to Redis.
					// and only they: whoever writes to Redis can grant approvals.
					for _, rp := range redisPods {
						if !networkAllows(objs, templateLabels(w), rp, port) {
							t.Errorf("%s: the NetworkPolicies do not let the broker's pods reach Redis on port %s", where, port)
						}
						for _, other := range objs {
							labels := templateLabels(other)
							if labels != nil && other.name != w.name && !selects(rp, labels) && networkAllows(objs, labels, rp, port) {
								t.Errorf("%s: %s %s may reach Redis on port %s: only the brokers may (grants are approvals)", where, other.kind, other.name, port)
							}
						}
					}
					if r.PasswordEnv != "" && !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == r.PasswordEnv }) {
						t.Errorf("%s: budgets.store.redis.password_env %s is not set in the container", where, r.PasswordEnv)
					}
				}
			}
		}
	}
	if brokers < 3 {
		t.Fatalf("found %d broker containers in the manifests, want the three examples'", brokers)
	}
}

// TestManifestsAPIValidation applies the API server's own rules that hold without a cluster
// (names, labels, selectors, ports, environment names, mounts), from apimachinery's
// validation: a kube-apiserver is not in Debian's packages, so this is the part of its
// validation a test can run here. Named ports are checked across objects: a Service's named
// targetPort and a probe's named port must be a port of the pods it reaches.
func TestManifestsAPIValidation(t *testing.T) {
	for _, dir := range manifestDirs(t) {
		objs := kustomize(t, dir)
		for _, o := range objs {
			where := fmt.Sprintf("%s: %s %s", o.file, o.kind, o.name)
			bad := func(what string, errs []string) {
				t.Helper()
				if len(errs) > 0 {
					t.Errorf("%s: %s: %s", where, what, strings.Join(errs, "; "))
				}
			}
			meta := o.obj.(metav1.Object)
			switch o.kind {
			case "Namespace":
				bad("metadata.name", validation.IsDNS1123Label(meta.GetName()))
			case "Service":
				bad("metadata.name", validation.IsDNS1035Label(meta.GetName()))
			default:
				bad("metadata.name", validation.IsDNS1123Subdomain(meta.GetName()))
			}
			bad("metadata.labels", fieldErrs(metav1validation.ValidateLabels(meta.GetLabels(), field.NewPath("metadata", "labels"))))
			switch v := o.obj.(type) {
			case *appsv1.Deployment:
				bad("spec.selector", fieldErrs(metav1validation.ValidateLabelSelector(v.Spec.Selector, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec", "selector"))))
				bad("spec.template.metadata.labels", fieldErrs(metav1validation.ValidateLabels(v.Spec.Template.Labels, field.NewPath("labels"))))
			case *appsv1.StatefulSet:
				bad("spec.selector", fieldErrs(metav1validation.ValidateLabelSelector(v.Spec.Selector, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec", "selector"))))
				bad("spec.template.metadata.labels", fieldErrs(metav1validation.ValidateLabels(v.Spec.Template.Labels, field.NewPath("labels"))))
				if v.Spec.ServiceName == "" {
					t.Errorf("%s: no spec.serviceName", where)
				}
			case *networkingv1.NetworkPolicy:
				bad("spec.podSelector", fieldErrs(metav1validation.ValidateLabelSelector(&v.Spec.PodSelector, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec", "podSelector"))))
			case *corev1.ConfigMap:
				for k := range v.Data {
					bad("data key "+k, validation.IsConfigMapKey(k))
				}
			case *corev1.Service:
				for _, p := range v.Spec.Ports {
					bad("port name", validation.IsDNS1123Label(p.Name))
					bad("port", validation.IsValidPortNum(int(p.Port)))
					if p.TargetPort.StrVal == "" {
						continue
					}
					found := false
					for _, w := range objs {
						if spec, labels := podSpec(w), templateLabels(w); spec != nil && selects(v.Spec.Selector, labels) {
							for _, c := range spec.Containers {
								found = found || slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.StrVal })
							}
						}
					}
					if !found {
						t.Errorf("%s: targetPort %q is a port of no pod the Service selects", where, p.TargetPort.StrVal)
					}
				}
			}
			if spec := podSpec(o); spec != nil {
				validatePodSpec(t, where, spec)
			}
		}
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func fieldErrs(l field.ErrorList) []string {
	var out []string
	for _, e := range l {
		out = append(out, e.Error())
	}
	return out
}

func validatePodSpec(t *testing.T, where string, spec *corev1.PodSpec) {
	t.Helper()
	bad := func(what string, errs []string) {
		t.Helper()
		if len(errs) > 0 {
			t.Errorf("%s: %s: %s", where, what, strings.Join(errs, "; "))
		}
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		bad("volume "+v.Name, validation.IsDNS1123Label(v.Name))
		if volumes[v.Name] {
			t.Errorf("%s: volume %s twice", where, v.Name)
		}
		volumes[v.Name] = true
		for _, mode := range []*int32{secretMode(v), configMapMode(v)} {
			if mode != nil && (*mode < 0 || *mode > 0o777) {
				t.Errorf("%s: volume %s: defaultMode %o", where, v.Name, *mode)
			}
		}
	}
	names := map[string]bool{}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		bad("container "+c.Name, validation.IsDNS1123Label(c.Name))
		if names[c.Name] {
			t.Errorf("%s: container %s twice", where, c.Name)
		}
		names[c.Name] = true
		ports := map[string]bool{}
		for _, p := range c.Ports {
			bad("container port", validation.IsValidPortNum(int(p.ContainerPort)))
			if p.Name != "" {
				bad("container port name", validation.IsValidPortName(p.Name))
				ports[p.Name] = true
			}
		}
		for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
			if pr == nil {
				continue
			}
			var named string
			if pr.HTTPGet != nil {
				named = pr.HTTPGet.Port.StrVal
			}
			if pr.TCPSocket != nil {
				named = pr.TCPSocket.Port.StrVal
			}
			if named != "" && !ports[named] {
				t.Errorf("%s/%s: a probe names port %q, which the container does not have", where, c.Name, named)
			}
		}
		for _, e := range c.Env {
			bad("env "+e.Name, validation.IsEnvVarName(e.Name))
		}
		paths := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if !path.IsAbs(m.MountPath) || paths[m.MountPath] {
				t.Errorf("%s/%s: mountPath %q is not absolute, or mounted twice", where, c.Name, m.MountPath)
			}
			paths[m.MountPath] = true
		}
	}
}

func secretMode(v corev1.Volume) *int32 {
	if v.Secret != nil {
		return v.Secret.DefaultMode
	}
	return nil
}

func configMapMode(v corev1.Volume) *int32 {
	if v.ConfigMap != nil {
		return v.ConfigMap.DefaultMode
	}
	return nil
}

// networkAllows reports whether the NetworkPolicies among objs let pods labelled from open
// TCP connections to pods labelled to on port: both the egress of from and the ingress of to
// must allow it (a pod no policy selects for a direction is open in that direction).
func networkAllows(objs []object, from, to map[string]string, port string) bool {
	allowed := func(direction networkingv1.PolicyType, self, peer map[string]string) bool {
		selected := false
		for _, o := range objs {
			np, ok := o.obj.(*networkingv1.NetworkPolicy)
			if !ok || !slices.Contains(np.Spec.PolicyTypes, direction) || !matches(np.Spec.PodSelector, self) {
				continue
			}
			selected = true
			type rule struct {
				peers []networkingv1.NetworkPolicyPeer
				ports []networkingv1.NetworkPolicyPort
			}
			var rules []rule
			for _, r := range np.Spec.Egress {
				if direction == networkingv1.PolicyTypeEgress {
					rules = append(rules, rule{r.To, r.Ports})
				}
			}
			for _, r := range np.Spec.Ingress {
				if direction == networkingv1.PolicyTypeIngress {
					rules = append(rules, rule{r.From, r.Ports})
				}
			}
			for _, r := range rules {
				peerOK := len(r.peers) == 0 || slices.ContainsFunc(r.peers, func(p networkingv1.NetworkPolicyPeer) bool {
					return p.PodSelector != nil && p.NamespaceSelector == nil && matches(*p.PodSelector, peer)
				})
				portOK := len(r.ports) == 0 || slices.ContainsFunc(r.ports, func(p networkingv1.NetworkPolicyPort) bool {
					return p.Port != nil && p.Port.String() == port && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP)
				})
				if peerOK && portOK {
					return true
				}
			}
		}
		return !selected
	}
	return allowed(networkingv1.PolicyTypeEgress, from, to) && allowed(networkingv1.PolicyTypeIngress, to, from)
}

// matches reports whether a label selector (matchLabels only; an empty one selects all) selects labels.
func matches(sel metav1.LabelSelector, labels map[string]string) bool {
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return len(sel.MatchExpressions) == 0
}

// TestManifestsPodSecurityRestricted: in a namespace that enforces the "restricted" Pod
// Security Standard, the admission controller would refuse a pod (and a Deployment or
// StatefulSet would just never get one) whose containers do not all run as non-root, without
// privilege escalation, with every capability dropped and the RuntimeDefault seccomp profile.
func TestManifestsPodSecurityRestricted(t *testing.T) {
	checked := 0
	for _, dir := range manifestDirs(t) {
		objs := kustomize(t, dir)
		restricted := map[string]bool{}
		for _, o := range objs {
			if ns, ok := o.obj.(*corev1.Namespace); ok && ns.Labels["pod-security.kubernetes.io/enforce"] == "restricted" {
				restricted[o.name] = true
			}
		}
		for _, o := range objs {
			spec := podSpec(o)
			if spec == nil || !restricted[o.ns] {
				continue
			}
			checked++
			pod := spec.SecurityContext
			if pod == nil {
				pod = &corev1.PodSecurityContext{}
			}
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				where := fmt.Sprintf("%s: %s %s/%s", o.file, o.kind, o.name, c.Name)
				sc := c.SecurityContext
				if sc == nil {
					sc = &corev1.SecurityContext{}
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation must be false", where)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 && !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_BIND_SERVICE"}) {
					t.Errorf("%s: capabilities must drop ALL (and add at most NET_BIND_SERVICE)", where)
				}
				nonRoot := sc.RunAsNonRoot
				if nonRoot == nil {
					nonRoot = pod.RunAsNonRoot
				}
				if nonRoot == nil || !*nonRoot || (sc.RunAsUser != nil && *sc.RunAsUser == 0) || (sc.RunAsUser == nil && pod.RunAsUser != nil && *pod.RunAsUser == 0) {
					t.Errorf("%s: must run as non-root (runAsNonRoot: true, no runAsUser 0)", where)
				}
				seccomp := sc.SeccompProfile
				if seccomp == nil {
					seccomp = pod.SeccompProfile
				}
				if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
					t.Errorf("%s: seccompProfile must be RuntimeDefault or Localhost", where)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no workload in a restricted namespace: the test checked nothing")
	}
}
