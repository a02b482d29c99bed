package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The benchmarks' record: an order of twelve items, about 1 KB encoded in
// either format (benchOrder checks it).

// orderAvro is the Avro schema of the benchmarks' order.
const orderAvro = `{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "customer", "type": "string"},
    {"name": "placed_at", "type": "long"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["PLACED", "PAID", "SHIPPED"]}},
    {"name": "items", "type": {"type": "array", "items": {
      "type": "record", "name": "Item",
      "fields": [
        {"name": "sku", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price_cents", "type": "long"}
      ]}}},
    {"name": "shipping_address", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": null}
  ]
}`

// orderProto is the same order as a .proto file.
const orderProto = `syntax = "proto3";
package shop;

message Order {
  string id = 1;
  string customer = 2;
  int64 placed_at = 3;
  Status status = 4;
  repeated Item items = 5;
  string shipping_address = 6;
  string note = 7;

  message Item {
    string sku = 1;
    string name = 2;
    int32 quantity = 3;
    int64 price_cents = 4;
  }
  enum Status {
    PLACED = 0;
    PAID = 1;
    SHIPPED = 2;
  }
}
`

// Order is the Go value of the Avro order (hamba/avro reads the tags).
type Order struct {
	ID              string  `avro:"id"`
	Customer        string  `avro:"customer"`
	PlacedAt        int64   `avro:"placed_at"`
	Status          string  `avro:"status"`
	Items           []Item  `avro:"items"`
	ShippingAddress string  `avro:"shipping_address"`
	Note            *string `avro:"note"`
}

// Item is one line of an Order.
type Item struct {
	SKU        string `avro:"sku"`
	Name       string `avro:"name"`
	Quantity   int32  `avro:"quantity"`
	PriceCents int64  `avro:"price_cents"`
}

const benchItems = 12

// benchOrder returns the benchmarks' order number n.
func benchOrder(n int) Order {
	note := "leave the parcel with the neighbour at number 12 if nobody answers"
	o := Order{
		ID:              fmt.Sprintf("order-%08d", n),
		Customer:        fmt.Sprintf("customer-%04d", n%1000),
		PlacedAt:        1_780_000_000_000 + int64(n),
		Status:          "PLACED",
		ShippingAddress: "Flat 4, 221 Long Street, Springfield, 4021, Somewhere",
		Note:            &note,
	}
	for i := range benchItems {
		o.Items = append(o.Items, Item{
			SKU:        fmt.Sprintf("SKU-%06d-%02d", n%100000, i),
			Name:       fmt.Sprintf("Stainless steel widget, model %02d, pack of %d pieces", i, i+2),
			Quantity:   int32(i + 1),
			PriceCents: int64(1999 + 100*i),
		})
	}
	return o
}

// orderDescriptor compiles orderProto (there is no protoc here) and returns
// its message shop.Order.
func orderDescriptor(tb testing.TB) protoreflect.MessageDescriptor {
	tb.Helper()
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": orderProto}),
	}}
	files, err := c.Compile(context.Background(), "order.proto")
	if err != nil {
		tb.Fatal(err)
	}
	return files[0].Messages().ByName("Order")
}

// protoOrder returns o as a dynamicpb message of md (shop.Order).
func protoOrder(md protoreflect.MessageDescriptor, o Order) *dynamicpb.Message {
	m := dynamicpb.NewMessage(md)
	f := md.Fields()
	m.Set(f.ByName("id"), protoreflect.ValueOfString(o.ID))
	m.Set(f.ByName("customer"), protoreflect.ValueOfString(o.Customer))
	m.Set(f.ByName("placed_at"), protoreflect.ValueOfInt64(o.PlacedAt))
	m.Set(f.ByName("status"), protoreflect.ValueOfEnum(0))
	m.Set(f.ByName("shipping_address"), protoreflect.ValueOfString(o.ShippingAddress))
	m.Set(f.ByName("note"), protoreflect.ValueOfString(*o.Note))
	itemDesc := md.Messages().ByName("Item")
	items := m.Mutable(f.ByName("items")).List()
	for _, it := range o.Items {
		im := dynamicpb.NewMessage(itemDesc)
		fi := itemDesc.Fields()
		im.Set(fi.ByName("sku"), protoreflect.ValueOfString(it.SKU))
		im.Set(fi.ByName("name"), protoreflect.ValueOfString(it.Name))
		im.Set(fi.ByName("quantity"), protoreflect.ValueOfInt32(it.Quantity))
		im.Set(fi.ByName("price_cents"), protoreflect.ValueOfInt64(it.PriceCents))
		items.Append(protoreflect.ValueOfMessage(im))
	}
	return m
}

// avroRecord is o in Avro binary (the record alone, no header).
func avroRecord(tb testing.TB, o Order) []byte {
	tb.Helper()
	b, err := avro.Marshal(avro.MustParse(orderAvro), o)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// protoRecord is o in protobuf binary (the record alone, no header).
func protoRecord(tb testing.TB, md protoreflect.MessageDescriptor, o Order) []byte {
	tb.Helper()
	b, err := proto.Marshal(protoOrder(md, o))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// checkSize fails tb unless the record is about 1 KB.
func checkSize(tb testing.TB, what string, record []byte) {
	tb.Helper()
	if len(record) < 900 || len(record) > 1200 {
		tb.Fatalf("the %s record is %d bytes, not about 1 KB: adjust benchOrder", what, len(record))
	}
}

// isWire reports a payload in the Confluent wire format with the given
// schema id.
func isWire(payload []byte, id string) bool {
	got, _, err := (&sr.ConfluentHeader{}).DecodeID(payload)
	return err == nil && fmt.Sprint(got) == strings.TrimSpace(id)
}
