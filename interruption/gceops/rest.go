package gceops

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

// Clients implements Lister and StatusReader with the Compute Engine REST
// clients.
type Clients struct {
	Operations *compute.ZoneOperationsClient
	Instances  *compute.InstancesClient
}

var (
	_ Lister       = (*Clients)(nil)
	_ StatusReader = (*Clients)(nil)
)

// NewClients creates the clients with Application Default Credentials, or
// against endpoint when it is set (a plain-http endpoint, i.e. a local
// fake, gets no credentials), as the gcp provider does.
func NewClients(ctx context.Context, endpoint string, opts ...option.ClientOption) (*Clients, error) {
	var all []option.ClientOption
	if endpoint != "" {
		all = append(all, option.WithEndpoint(endpoint))
		if u, err := url.Parse(endpoint); err == nil && u.Scheme == "http" {
			all = append(all, option.WithoutAuthentication())
		}
	}
	all = append(all, opts...)
	ops, err := compute.NewZoneOperationsRESTClient(ctx, all...)
	if err != nil {
		return nil, fmt.Errorf("gceops: zone operations client: %w", err)
	}
	ins, err := compute.NewInstancesRESTClient(ctx, all...)
	if err != nil {
		_ = ops.Close()
		return nil, fmt.Errorf("gceops: instances client: %w", err)
	}
	return &Clients{Operations: ops, Instances: ins}, nil
}

// Close closes both clients.
func (c *Clients) Close() error {
	return errors.Join(c.Operations.Close(), c.Instances.Close())
}

// ListZoneOperations lists every page of a zone's operations matching filter.
func (c *Clients) ListZoneOperations(ctx context.Context, project, zone, filter string) ([]Operation, error) {
	it := c.Operations.List(ctx, &computepb.ListZoneOperationsRequest{Project: project, Zone: zone, Filter: proto.String(filter)})
	var out []Operation
	for {
		op, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		t, err := parseTime(op.GetInsertTime())
		if err != nil {
			return nil, err
		}
		out = append(out, Operation{
			ID: formatID(op.GetId()), Name: op.GetName(), OperationType: op.GetOperationType(),
			TargetLink: op.GetTargetLink(), TargetID: formatID(op.GetTargetId()),
			StatusMessage: op.GetStatusMessage(), InsertTime: t,
		})
	}
}

// InstanceStatus returns an instance's status, or ErrInstanceNotFound.
func (c *Clients) InstanceStatus(ctx context.Context, project, zone, name string) (string, error) {
	in, err := c.Instances.Get(ctx, &computepb.GetInstanceRequest{Project: project, Zone: zone, Instance: name})
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == http.StatusNotFound {
		return "", fmt.Errorf("%s/%s: %w", zone, name, ErrInstanceNotFound)
	}
	if err != nil {
		return "", err
	}
	return in.GetStatus(), nil
}
