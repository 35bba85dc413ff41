package deploy_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/capbroker/capbroker/broker/config"
)

// TestFleetManifests: deploy/kubernetes/fleet runs the broker as a fleet (docs/fleet.md): its
// config has a fleet section over a Redis store; each pod is named by POD_NAME; the grace
// period covers the drain; the HPA scales that Deployment on CPU and requests in flight; the
// PDB covers its pods; no ConfigMap is mounted with subPath (it would never be updated); and
// agents reach the brokers' proxy port alone, Redis the brokers alone.
func TestFleetManifests(t *testing.T) {
	objs := kustomize(t, filepath.Join(manifestsDir, "fleet"))
	var dep *appsv1.Deployment
	var hpa *autoscalingv2.HorizontalPodAutoscaler
	var pdb *policyv1.PodDisruptionBudget
	nps := map[string]*networkingv1.NetworkPolicy{}
	cms := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			if o.name == "capbroker" {
				dep = v
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			hpa = v
		case *policyv1.PodDisruptionBudget:
			pdb = v
		case *networkingv1.NetworkPolicy:
			nps[o.name] = v
		case *corev1.ConfigMap:
			cms[o.name] = v
		}
	}
	if dep == nil || hpa == nil || pdb == nil {
		t.Fatalf("the fleet needs a Deployment capbroker, an HPA and a PDB: %v %v %v", dep != nil, hpa != nil, pdb != nil)
	}
	cfg, err := config.Parse([]byte(cms["capbroker-config"].Data["broker.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetDefaults()
	if cfg.Fleet == nil || cfg.Budgets.Store.Redis == nil {
		t.Fatal("the fleet's config has no fleet section or no budgets.store.redis")
	}
	if n := *dep.Spec.Replicas; n < 2 {
		t.Errorf("the fleet runs %d replicas", n)
	}
	spec := dep.Spec.Template.Spec
	broker := spec.Containers[0]
	if !slices.ContainsFunc(broker.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Error("POD_NAME is not the pod's name: the replicas would share one instance name")
	}
	const drainGrace = 30 * time.Second // cmd/broker drainGrace
	need := cfg.Fleet.DrainDelay + drainGrace
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %v does not cover drain_delay and the drain (%s)", g, need)
	}
	if p := broker.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Error("the readiness probe is not /readyz: a draining pod would stay in the Service")
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, m := range c.VolumeMounts {
			if m.SubPath != "" {
				t.Errorf("%s mounts %s with subPath: the kubelet never updates it", c.Name, m.Name)
			}
		}
	}
	if r := hpa.Spec.ScaleTargetRef; r.Kind != "Deployment" || r.Name != "capbroker" {
		t.Errorf("the HPA scales %s %s", r.Kind, r.Name)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
		t.Error("the HPA may scale the fleet to one replica")
	}
	var cpu, inflight bool
	for _, m := range hpa.Spec.Metrics {
		cpu = cpu || m.Resource != nil && m.Resource.Name == corev1.ResourceCPU
		inflight = inflight || m.Pods != nil && m.Pods.Metric.Name == "capbroker_requests_in_flight"
	}
	if !cpu || !inflight {
		t.Errorf("the HPA scales on cpu %v, requests in flight %v: want both", cpu, inflight)
	}
	for k, v := range pdb.Spec.Selector.MatchLabels {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the PDB selects %s=%s, which the brokers' pods lack", k, v)
		}
	}
	agents := nps["agents-egress-only-to-broker"]
	if agents == nil || len(agents.Spec.Egress) != 1 || len(agents.Spec.Egress[0].Ports) != 1 || agents.Spec.Egress[0].Ports[0].Port.IntValue() != 8080 {
		t.Error("agents may reach more than the brokers' proxy port")
	}
	redis := nps["redis"]
	if redis == nil || len(redis.Spec.Ingress) != 1 || redis.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "capbroker" {
		t.Error("Redis may be reached by more than the brokers")
	}
}
